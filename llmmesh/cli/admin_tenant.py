"""``llmmesh admin tenant update``, ``tenant delete`` and ``key list``: a
tenant's settings changed in place, a tenant deleted, and a tenant's keys
listed (their prefixes, never their secrets).

``tenant delete`` asks for ``--yes``, or, at a terminal, for the tenant's
name typed back. What a deletion does is ``PolicyService.DeleteTenant``'s:
its keys are revoked at once, regions refuse it from their next policy
snapshot and purge its zone-bound data, its usage stays for billing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import grpc.aio

from llmmesh.cli.admin_output import _TIERS, CALL_TIMEOUT_S, AdminError, _as_dict, _table, _tenant_rows, _time
from llmmesh.core.pages import collect_pages
from llmmesh.v1 import policy_service_pb2 as ppb
from llmmesh.v1 import policy_service_pb2_grpc


async def tenant_update(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    """Change only the settings given; AdminError (status 2) when none is."""
    changes = ppb.Tenant()
    fields: list[str] = []
    if args.tier is not None:
        changes.tier, fields = _TIERS[args.tier], [*fields, "tier"]
    for flag, field in (("rpm", "rpm_limit"), ("tpm", "tpm_limit"), ("quota", "monthly_token_quota")):
        if getattr(args, flag) is not None:
            setattr(changes, field, getattr(args, flag))
            fields.append(field)
    if args.models is not None:
        changes.allowed_models[:] = [m.strip() for m in args.models.split(",") if m.strip()]
        fields.append("allowed_models")
    if args.retention_days is not None:
        changes.conversation_retention_days = args.retention_days
        fields.append("conversation_retention_days")
    if args.memory is not None:
        changes.memory_enabled = args.memory
        fields.append("memory_enabled")
    for field, _ in CAPS:
        if getattr(args, field) is not None:
            setattr(changes, field, getattr(args, field))
            fields.append(field)
    if not fields:
        raise AdminError(
            "nothing to update: give --tier, --rpm, --tpm, --quota, --models, --retention-days, "
            "--memory/--no-memory, --max-files, --max-vector-stores, --max-memories-per-user "
            "or --background-tokens-per-day",
            "INVALID_REQUEST",
            2,
        )
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
    current = (await stub.GetTenant(ppb.GetTenantRequest(tenant=args.tenant), timeout=CALL_TIMEOUT_S)).tenant
    changes.id = current.id
    request = ppb.UpdateTenantRequest(tenant=changes, update_fields=fields)
    tenant = (await stub.UpdateTenant(request, timeout=CALL_TIMEOUT_S)).tenant
    if not args.json:
        print(_tenant_rows([tenant]))
    return _as_dict(tenant)


CAPS = (
    ("max_files", "most files it keeps in its zone"),
    ("max_vector_stores", "most vector stores it keeps in its zone"),
    ("max_memories_per_user", "most facts kept about one end user (the oldest go first)"),
    (
        "background_tokens_per_day",
        "most tokens a day (UTC) spent on its conversation summaries and memory extraction",
    ),
)
"""The tenant's caps: (field, what it bounds); 0 means the region's default."""


def add_cap_arguments(parser: argparse.ArgumentParser, default: int | None) -> None:
    for field, what in CAPS:
        parser.add_argument(
            f"--{field.replace('_', '-')}",
            type=int,
            default=default,
            help=f"{what}; 0 = the region's default",
        )


def _key_rows(keys: Sequence[ppb.ApiKey]) -> str:
    rows = [
        (
            k.id,
            k.display_prefix + "…",
            _time(k.create_time),
            _time(k.expire_time) if k.HasField("expire_time") else "never",
            "revoked " + _time(k.revoke_time) if k.HasField("revoke_time") else "active",
        )
        for k in keys
    ]
    return _table(("KEY ID", "PREFIX", "CREATED", "EXPIRES", "STATE"), rows)


async def key_list(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)

    async def fetch(token: str) -> tuple[Sequence[ppb.ApiKey], str]:
        request = ppb.ListApiKeysRequest(tenant=args.tenant, page_size=500, page_token=token)
        page = await stub.ListApiKeys(request, timeout=CALL_TIMEOUT_S)
        return page.api_keys, page.next_page_token

    keys = await collect_pages(fetch)
    if not args.json:
        print(_key_rows(keys) if keys else "no keys")
    return [_as_dict(k) for k in keys]


def add_tenant_update_arguments(
    tenant: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    update = tenant.add_parser(
        "update", parents=[common], help="change a tenant's tier, limits, models, retention or memory"
    )
    update.add_argument("tenant", help="tenant name or id")
    update.add_argument("--tier", choices=sorted(_TIERS), default=None, help="service tier")
    update.add_argument("--rpm", type=int, default=None, help="requests per minute per key; 0 = unlimited")
    update.add_argument("--tpm", type=int, default=None, help="tokens per minute per key; 0 = unlimited")
    update.add_argument("--quota", type=int, default=None, help="tokens per month; 0 = unlimited")
    update.add_argument(
        "--models", default=None, help="comma-separated models it may use; '' = all of its tier"
    )
    update.add_argument(
        "--retention-days",
        type=int,
        default=None,
        help="days deleted conversations are kept before their purge; 0 = the region's default",
    )
    update.add_argument(
        "--memory", action=argparse.BooleanOptionalAction, default=None, help="keep end users' facts, or stop"
    )
    add_cap_arguments(update, None)
    update.set_defaults(admin_command=tenant_update)


async def tenant_delete(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    """Delete a tenant once confirmed; AdminError (status 2) when it is not."""
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
    tenant = (await stub.GetTenant(ppb.GetTenantRequest(tenant=args.tenant), timeout=CALL_TIMEOUT_S)).tenant
    if not args.yes:
        _confirm(tenant)
    deleted = await stub.DeleteTenant(ppb.DeleteTenantRequest(tenant=tenant.id), timeout=CALL_TIMEOUT_S)
    if not args.json:
        print(
            f"deleted tenant {deleted.tenant.name} ({deleted.tenant.id}, zone {deleted.tenant.zone}) at "
            f"{_time(deleted.tenant.delete_time)}: {deleted.revoked_keys} keys revoked; its regions "
            "refuse it from their next policy snapshot and purge its conversations, files, vector "
            "stores and memories; its usage stays for billing"
        )
    return {**_as_dict(deleted.tenant), "revoked_keys": deleted.revoked_keys}


def _confirm(tenant: ppb.Tenant) -> None:
    """The operator types the tenant's name back at a terminal; anything else refuses."""
    refusal = AdminError(
        f"deleting tenant {tenant.name!r} removes its zone data for good: pass --yes to confirm",
        "CONFIRMATION_REQUIRED",
        2,
    )
    if not sys.stdin.isatty():
        raise refusal
    print(
        f"Delete tenant {tenant.name} ({tenant.id}, zone {tenant.zone})? Its keys stop working and its "
        "conversations, files, vector stores and memories are purged.",
        file=sys.stderr,
    )
    try:
        typed = input("Type its name to confirm: ")
    except EOFError:
        raise refusal from None
    if typed.strip() != tenant.name:
        raise refusal


def add_tenant_delete_arguments(
    tenant: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    delete = tenant.add_parser(
        "delete",
        parents=[common],
        help="delete a tenant: keys revoked, zone data purged by its regions, usage kept",
    )
    delete.add_argument("tenant", help="tenant name or id")
    delete.add_argument("--yes", action="store_true", help="delete without asking to confirm")
    delete.set_defaults(admin_command=tenant_delete)


def add_key_list_arguments(key: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    listing = key.add_parser(
        "list", parents=[common], help="a tenant's keys: prefixes and states, never secrets"
    )
    listing.add_argument("tenant", help="tenant name or id")
    listing.set_defaults(admin_command=key_list)
