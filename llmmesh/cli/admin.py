"""``llmmesh admin``: tenants, API keys, usage and region health, over the global plane's gRPC API.

Speaks only the generated stubs. The address comes from ``--global-address``
or from ``$LLMMESH_HOME/mesh.json`` (written by ``llmmesh up``). The calls
present the mesh's ``admin`` certificate (mutual TLS; ``--certs-dir``, else
the mesh file's, else ``$LLMMESH_HOME/certs``), or go plaintext with
``--insecure`` or when the mesh file says the mesh runs so. ``audit`` lists
the global plane's log of admin changes. Output is a
human-readable table, or JSON with ``--json``. Any failure prints one line,
``llmmesh admin: <message> (<REASON>)``, to stderr; the exit status is 2
when the input was at fault (rejected arguments, unknown or duplicate
names, no address to talk to) and 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import grpc.aio

from llmmesh.cli.admin_end_user import end_user_pseudonym
from llmmesh.cli.admin_model import add_model_arguments
from llmmesh.cli.admin_output import (
    _TIERS,
    CALL_TIMEOUT_S,
    AdminError,
    _as_dict,
    _table,
    _tenant_rows,
    _time,
)
from llmmesh.cli.admin_region import add_region_arguments
from llmmesh.cli.admin_tenant import (
    CAPS,
    add_cap_arguments,
    add_key_list_arguments,
    add_tenant_delete_arguments,
    add_tenant_update_arguments,
)
from llmmesh.cli.tls_flags import add_tls_arguments, tls_from_args
from llmmesh.client import CertificateSetupError, MeshTls
from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.core.pages import collect_pages
from llmmesh.core.usage_purpose import purpose_name
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    common_pb2,
    geo_routing_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb

AUDIT_PAGE_SIZE = 500
_HEALTH_NAMES = {
    common_pb2.HEALTH_STATE_SERVING: "serving",
    common_pb2.HEALTH_STATE_DEGRADED: "degraded",
    common_pb2.HEALTH_STATE_DRAINING: "draining",
    common_pb2.HEALTH_STATE_DOWN: "down",
}
# Codes that mean "your input is wrong", as opposed to "something broke".
_BAD_INPUT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


Command = Callable[[grpc.aio.Channel, argparse.Namespace], Awaitable[Any]]
"""Runs one admin command; returns what ``--json`` prints (the table is printed by the command)."""


# ------------------------------------------------------------------ output


# ------------------------------------------------------------------ commands


async def _tenant_create(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    models = [m.strip() for m in (args.models or "").split(",") if m.strip()]
    spec = ppb.Tenant(
        name=args.name,
        zone=args.zone,
        tier=_TIERS[args.tier],
        rpm_limit=args.rpm,
        tpm_limit=args.tpm,
        monthly_token_quota=args.quota,
        allowed_models=models,
        conversation_retention_days=args.retention_days,
        memory_enabled=args.memory,
        **{field: getattr(args, field) for field, _ in CAPS},
    )
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
    request = ppb.CreateTenantRequest(tenant=spec, allow_empty_zone=args.allow_empty_zone)
    tenant = (await stub.CreateTenant(request, timeout=CALL_TIMEOUT_S)).tenant
    if not args.json:
        print(_tenant_rows([tenant]))
    return _as_dict(tenant)


async def _tenant_list(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)

    async def fetch(token: str) -> tuple[Sequence[ppb.Tenant], str]:
        request = ppb.ListTenantsRequest(zone=args.zone, page_size=500, page_token=token)
        page = await stub.ListTenants(request, timeout=CALL_TIMEOUT_S)
        return page.tenants, page.next_page_token

    tenants = await collect_pages(fetch)
    if not args.json:
        print(_tenant_rows(tenants) if tenants else "no tenants")
    return [_as_dict(t) for t in tenants]


async def _key_create(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    request = ppb.CreateApiKeyRequest(tenant=args.tenant)
    if args.expires_in_days is not None:
        request.expire_time.FromDatetime(datetime.now(UTC) + timedelta(days=args.expires_in_days))
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
    created = await stub.CreateApiKey(request, timeout=CALL_TIMEOUT_S)
    key = created.api_key
    if not args.json:
        print(f"key id   {key.id}")
        print(f"tenant   {key.tenant_id}")
        print(f"expires  {_time(key.expire_time) if key.HasField('expire_time') else 'never'}")
        print(f"secret   {created.secret}")
        print("The secret is shown only now; store it safely.")
    return {**_as_dict(key), "secret": created.secret}


async def _key_revoke(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
    request = ppb.RevokeApiKeyRequest(key_id=args.key_id)
    key = (await stub.RevokeApiKey(request, timeout=CALL_TIMEOUT_S)).api_key
    if not args.json:
        print(f"revoked key {key.id} of tenant {key.tenant_id} at {_time(key.revoke_time)}")
    return _as_dict(key)


async def _usage(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = billing_service_pb2_grpc.BillingServiceStub(channel)
    # Billing knows an end user only by the pseudonym a region of the tenant's zone computes.
    found = (
        await end_user_pseudonym(channel, args.tenant, args.end_user, args.security)
        if args.end_user
        else None
    )
    request = bpb.GetUsageRequest(
        tenant_id=args.tenant, period=args.period, end_user=found.pseudonym if found else ""
    )
    usage = await stub.GetUsage(request, timeout=CALL_TIMEOUT_S)
    if not args.json:
        if found:
            print(f"end user {args.end_user!r} is {found.pseudonym} outside zone {found.zone}")
        rows = [
            (
                usage.period,
                "all",
                "all",
                usage.requests,
                usage.input_tokens,
                usage.output_tokens,
                usage.cost_usd,
            )
        ]
        rows += [
            (
                usage.period,
                m.model,
                purpose_name(m.purpose),
                m.requests,
                m.input_tokens,
                m.output_tokens,
                m.cost_usd,
            )
            for m in usage.models
        ]
        header = ("PERIOD", "MODEL", "PURPOSE", "REQUESTS", "INPUT TOKENS", "OUTPUT TOKENS", "COST USD")
        print(_table(header, rows))
    answer = {**_as_dict(usage), "tenant": args.tenant}
    if found is None:
        return answer
    return {**answer, "end_user": args.end_user, "end_user_pseudonym": found.pseudonym}


async def _regions(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)

    async def fetch(token: str) -> tuple[Sequence[gpb.RegionStatus], str]:
        request = gpb.ListRegionsRequest(zone=args.zone, page_size=500, page_token=token)
        page = await stub.ListRegions(request, timeout=CALL_TIMEOUT_S)
        return page.regions, page.next_page_token

    statuses = await collect_pages(fetch)
    now = datetime.now(UTC)
    ages = [(now - s.last_heartbeat_time.ToDatetime(tzinfo=UTC)).total_seconds() for s in statuses]
    if not args.json:
        rows = [
            (
                s.report.region,
                s.report.zone,
                _HEALTH_NAMES.get(s.effective_health, "?"),
                f"{max(age, 0.0):.1f}s",
                s.report.queue_depth,
                s.report.capacity,
                f"{s.report.healthy_engine_pods}/{s.report.engine_pods}",
                ",".join(s.report.models) or "-",
            )
            for s, age in zip(statuses, ages, strict=True)
        ]
        headers = ("REGION", "ZONE", "HEALTH", "HEARTBEAT AGE", "QUEUE", "CAPACITY", "PODS", "MODELS")
        print(_table(headers, rows) if rows else "no regions have reported")
    return [
        {**_as_dict(s), "heartbeat_age_s": round(max(age, 0.0), 3)}
        for s, age in zip(statuses, ages, strict=True)
    ]


async def _audit(channel: grpc.aio.Channel, args: argparse.Namespace) -> Any:
    stub = policy_service_pb2_grpc.PolicyServiceStub(channel)

    async def fetch(token: str) -> tuple[Sequence[ppb.AuditEvent], str]:
        request = ppb.ListAuditEventsRequest(page_size=AUDIT_PAGE_SIZE, page_token=token)
        page = await stub.ListAuditEvents(request, timeout=CALL_TIMEOUT_S)
        return page.events, page.next_page_token

    events = await collect_pages(fetch)
    if not args.json:
        rows = [(e.id, _time(e.event_time), e.actor, e.method, e.target) for e in events]
        print(_table(("ID", "TIME", "ACTOR", "METHOD", "TARGET"), rows) if rows else "no admin changes")
    return [_audit_entry(e) for e in events]


def _audit_entry(event: ppb.AuditEvent) -> dict[str, Any]:
    """An event as JSON, its request as an object rather than a string of JSON."""
    entry = _as_dict(event)
    try:
        entry["request"] = json.loads(entry.pop("request_json", "") or "{}")
    except ValueError:
        entry["request"] = event.request_json
    return entry


# ------------------------------------------------------------------ plumbing


def _global_plane(args: argparse.Namespace) -> tuple[str, MeshTls]:
    """The global plane's address and how to reach it: the flags, else ``mesh.json``."""
    if args.global_address:
        return str(args.global_address), tls_from_args(args)
    mesh_file = mesh_home() / "mesh.json"
    try:
        data = json.loads(mesh_file.read_text())
        address = data.get("global_address")
        tls = MeshTls.from_json(data.get("tls"))
    except FileNotFoundError:
        raise AdminError(
            f"no {mesh_file}; pass --global-address or start a mesh with `llmmesh up`", "NO_MESH", 2
        ) from None
    except (OSError, ValueError, AttributeError) as err:
        raise AdminError(f"cannot read {mesh_file}: {err}", "NO_MESH", 2) from None
    if not isinstance(address, str) or not address:
        raise AdminError(f"{mesh_file} names no global_address", "NO_MESH", 2)
    return address, tls_from_args(args, tls)


def _admin_error(err: grpc.aio.AioRpcError, address: str, security: MeshSecurity) -> AdminError:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        # A plaintext call to an mTLS plane fails as a broken connection, which says nothing of why.
        hint = "" if security.enabled else " (plaintext, as --insecure asks: does the mesh run mTLS?)"
        details = " ".join((err.details() or "").split())
        return AdminError(
            f"cannot reach the global plane at {address}{hint}: {details}", "GLOBAL_PLANE_UNAVAILABLE", 1
        )
    mesh_error = from_rpc_error(err)
    return AdminError(mesh_error.message, mesh_error.reason, 2 if code in _BAD_INPUT else 1)


async def _call(command: Command, args: argparse.Namespace, address: str, security: MeshSecurity) -> Any:
    # A command that dials another plane (a region) presents the same certificate.
    args.security = security
    async with open_channel(address, security, role_name(Role.GLOBAL)) as channel:
        try:
            return await command(channel, args)
        except grpc.aio.AioRpcError as err:
            raise _admin_error(err, address, security) from None


def run_admin(args: argparse.Namespace) -> int:
    """Run the chosen admin command; 0 on success, else 2 (bad input) or 1, after one stderr line."""
    try:
        address, tls = _global_plane(args)
        try:
            security = tls.security("admin")
        except CertificateSetupError as err:
            raise AdminError(str(err), "NO_CERTIFICATE", 2) from None
        result = asyncio.run(_call(args.admin_command, args, address, security))
    except AdminError as err:
        print(f"llmmesh admin: {err.message} ({err.reason})", file=sys.stderr)
        return err.status
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``admin`` subcommands; each sets ``admin_command``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--global-address", default="", help="host:port of the global plane (default: from mesh.json)"
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_tls_arguments(common)
    groups = parser.add_subparsers(dest="admin_group", required=True, metavar="TOPIC")

    tenant = groups.add_parser("tenant", help="create, list, update and delete tenants").add_subparsers(
        dest="tenant_action", required=True, metavar="ACTION"
    )
    create = tenant.add_parser("create", parents=[common], help="create a tenant pinned to a zone")
    create.add_argument("name", help="unique tenant name")
    create.add_argument("--zone", required=True, help="zone the tenant is pinned to, like eu or us")
    create.add_argument("--tier", required=True, choices=sorted(_TIERS), help="service tier")
    create.add_argument("--rpm", type=int, default=0, help="requests per minute per key; 0 = unlimited")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute per key; 0 = unlimited")
    create.add_argument("--quota", type=int, default=0, help="tokens per month; 0 = unlimited")
    create.add_argument(
        "--models", default="", help="comma-separated models it may use; empty = all of its tier"
    )
    create.add_argument(
        "--retention-days",
        type=int,
        default=0,
        help="days deleted conversations are kept before their purge; 0 = the region's default",
    )
    create.add_argument(
        "--memory",
        action="store_true",
        help="keep facts about the tenant's end users and put them in their turns (off by default)",
    )
    create.add_argument(
        "--allow-empty-zone",
        action="store_true",
        help="create it even when no region of its zone has reported and the mesh's topology names "
        "no such zone (its regions come later)",
    )
    add_cap_arguments(create, 0)
    create.set_defaults(admin_command=_tenant_create)
    listing = tenant.add_parser("list", parents=[common], help="list tenants")
    listing.add_argument("--zone", default="", help="only tenants of this zone")
    listing.set_defaults(admin_command=_tenant_list)
    add_tenant_update_arguments(tenant, common)
    add_tenant_delete_arguments(tenant, common)

    key = groups.add_parser("key", help="create, revoke and list API keys").add_subparsers(
        dest="key_action", required=True, metavar="ACTION"
    )
    key_create = key.add_parser("create", parents=[common], help="create an API key; prints its secret once")
    key_create.add_argument("tenant", help="tenant name or id")
    key_create.add_argument("--expires-in-days", type=int, default=None, help="expiry; default never")
    key_create.set_defaults(admin_command=_key_create)
    revoke = key.add_parser("revoke", parents=[common], help="revoke an API key")
    revoke.add_argument("key_id", help="id of the key, key_…")
    revoke.set_defaults(admin_command=_key_revoke)
    add_key_list_arguments(key, common)

    usage = groups.add_parser("usage", parents=[common], help="a tenant's usage and cost in one month")
    usage.add_argument("tenant", help="tenant name or id")
    usage.add_argument("--period", default="", help="month as YYYY-MM (UTC); default the current one")
    usage.add_argument(
        "--end-user",
        default="",
        help="only the turns made for this end user (the request's `user`); a region of the tenant's "
        "zone turns it into the pseudonym billing knows it by",
    )
    usage.set_defaults(admin_command=_usage)

    regions = groups.add_parser("regions", parents=[common], help="region health as the global plane sees it")
    regions.add_argument("--zone", default="", help="only regions of this zone")
    regions.set_defaults(admin_command=_regions)

    audit = groups.add_parser(
        "audit", parents=[common], help="the log of admin changes (who changed which tenant, key or model)"
    )
    audit.set_defaults(admin_command=_audit)

    add_model_arguments(groups, common)
    add_region_arguments(groups, common)
