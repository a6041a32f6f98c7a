"""What ``llmmesh up`` asks of the global plane once it serves: a development
tenant in every zone, and whether every region serves in geo-routing.

Only the global plane's public gRPC API is used, as ``llmmesh admin`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.cli.supervisor import MeshStartError
from llmmesh.core.errors import Reason, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.v1 import common_pb2, geo_routing_service_pb2_grpc, policy_service_pb2_grpc
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb

CALL_TIMEOUT_S = 10.0
PRIMARY_DEV_TENANT = "dev"
"""The global plane's own development tenant (``llmmesh global --dev-tenant``)."""


@dataclass(frozen=True)
class DevTenant:
    """A development tenant pinned to ``zone`` and the secret of its key."""

    zone: str
    name: str
    key: str


def dev_tenants(zones: Sequence[str], primary_zone: str, dev_key: str) -> list[DevTenant]:
    """One tenant per zone: the global plane's ``dev`` with ``dev_key`` in
    ``primary_zone``; ``dev-<zone>`` with ``<dev_key>-<zone>`` in every other."""
    if not dev_key:
        return []
    return [
        DevTenant(zone, PRIMARY_DEV_TENANT, dev_key)
        if zone == primary_zone
        else DevTenant(zone, f"{PRIMARY_DEV_TENANT}-{zone}", f"{dev_key}-{zone}")
        for zone in zones
    ]


async def ensure_dev_tenants(
    global_address: str, tenants: Sequence[DevTenant], security: MeshSecurity
) -> dict[str, str]:
    """Make every tenant exist in its zone with its key, and return their ids by zone.

    Idempotent, since the global store outlives the mesh. MeshStartError
    when a key or a tenant name is already taken in another zone (zones
    never change) or a key is revoked. ``security`` is an admin's.
    """
    channel = open_channel(global_address, security, role_name(Role.GLOBAL))
    async with channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        return {tenant.zone: await _ensure(policy, tenant) for tenant in tenants}


async def _ensure(policy: policy_service_pb2_grpc.PolicyServiceStub, dev: DevTenant) -> str:
    try:
        found = await policy.AuthenticateKey(
            ppb.AuthenticateKeyRequest(secret=dev.key), timeout=CALL_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as err:
        error = from_rpc_error(err)
        if error.reason != Reason.API_KEY_INVALID:
            raise MeshStartError(
                f"the dev key of zone {dev.zone} is unusable ({error.message}): use another --dev-key"
            ) from None
    else:
        return _in_zone(dev, found.tenant)
    try:
        spec = ppb.Tenant(name=dev.name, zone=dev.zone, tier=common_pb2.TIER_PRO)
        created = await policy.CreateTenant(ppb.CreateTenantRequest(tenant=spec), timeout=CALL_TIMEOUT_S)
        tenant = created.tenant
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise MeshStartError(f"cannot create tenant {dev.name}: {from_rpc_error(err).message}") from None
        tenant = (
            await policy.GetTenant(ppb.GetTenantRequest(tenant=dev.name), timeout=CALL_TIMEOUT_S)
        ).tenant
    _in_zone(dev, tenant)
    await policy.CreateApiKey(
        ppb.CreateApiKeyRequest(tenant=tenant.id, secret=dev.key), timeout=CALL_TIMEOUT_S
    )
    return str(tenant.id)


def _in_zone(dev: DevTenant, tenant: ppb.Tenant) -> str:
    """The id of ``tenant``, which must be pinned to ``dev``'s zone."""
    if tenant.zone != dev.zone:
        raise MeshStartError(
            f"dev tenant {tenant.name!r} is pinned to zone {tenant.zone}, not {dev.zone} (the global store "
            "keeps tenants across runs): use another --dev-key or --zone"
        )
    return str(tenant.id)


async def wait_regions_serving(
    global_address: str,
    regions: Sequence[str],
    timeout_s: float,
    check: Callable[[], None],
    security: MeshSecurity,
) -> None:
    """Return once geo-routing lists every region of ``regions`` as SERVING.

    ``check`` runs between polls and may raise to give up (a plane exited,
    a stop was asked for); MeshStartError when ``timeout_s`` runs out.
    """
    deadline = time.monotonic() + timeout_s
    channel = open_channel(global_address, security, role_name(Role.GLOBAL))
    async with channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        while True:
            check()
            try:
                listed = await geo.ListRegions(gpb.ListRegionsRequest(page_size=500), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as err:
                raise MeshStartError(f"geo-routing did not answer: {err.details()}") from None
            serving = {
                s.report.region
                for s in listed.regions
                if s.effective_health == common_pb2.HEALTH_STATE_SERVING
            }
            waiting = set(regions) - serving
            if not waiting:
                return
            if time.monotonic() > deadline:
                names = ", ".join(sorted(waiting))
                raise MeshStartError(f"geo-routing does not list {names} as serving within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
