"""An end user's pseudonym, for ``llmmesh admin usage --end-user``.

Billing knows end users only by their pseudonyms, which only a region of
the tenant's zone can compute (its zone's key never leaves the zone). So
the command asks the global plane for the tenant's zone and that zone's
regions, then asks a serving one (``EndUserService.PseudonymizeEndUser``,
an admin's call, to a server whose certificate names that zone), trying
the next when one cannot be reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.cli.admin_output import CALL_TIMEOUT_S, AdminError
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.core.pages import collect_pages
from llmmesh.v1 import (
    common_pb2,
    end_user_service_pb2_grpc,
    geo_routing_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import end_user_service_pb2 as epb
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb

_SERVING = (common_pb2.HEALTH_STATE_SERVING, common_pb2.HEALTH_STATE_DEGRADED)
# A region that cannot answer now; the next of the zone may.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class EndUserPseudonym:
    """An end user's pseudonym and the zone (and region) that computed it."""

    pseudonym: str
    zone: str
    region: str


async def _zone_regions(channel: grpc.aio.Channel, zone: str) -> list[gpb.RegionStatus]:
    """The zone's serving regions, as the global plane's directory lists them, serving ones first."""
    stub = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)

    async def fetch(token: str) -> tuple[Sequence[gpb.RegionStatus], str]:
        request = gpb.ListRegionsRequest(zone=zone, page_size=500, page_token=token)
        page = await stub.ListRegions(request, timeout=CALL_TIMEOUT_S)
        return page.regions, page.next_page_token

    listed = [
        s for s in await collect_pages(fetch) if s.effective_health in _SERVING and s.report.chat_address
    ]
    return sorted(listed, key=lambda s: _SERVING.index(s.effective_health))


async def end_user_pseudonym(
    channel: grpc.aio.Channel, tenant: str, end_user: str, security: MeshSecurity
) -> EndUserPseudonym:
    """The pseudonym of ``tenant``'s (a name or an id) ``end_user``, from a
    region of its zone; ``channel`` reaches the global plane. AdminError
    when no region of the zone serves or none can be reached."""
    policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
    found = (await policy.GetTenant(ppb.GetTenantRequest(tenant=tenant), timeout=CALL_TIMEOUT_S)).tenant
    regions = await _zone_regions(channel, found.zone)
    if not regions:
        raise AdminError(
            f"no region of zone {found.zone!r} is serving: only a region of the tenant's zone "
            "computes its end users' pseudonyms, which billing knows them by",
            "NO_REGION_IN_ZONE",
            1,
        )
    request = epb.PseudonymizeEndUserRequest(tenant_id=found.id, end_user=end_user)
    failures: list[str] = []
    for status in regions:
        report = status.report
        async with open_channel(report.chat_address, security, role_name(Role.REGION, found.zone)) as region:
            stub = end_user_service_pb2_grpc.EndUserServiceStub(region)
            try:
                answer = await stub.PseudonymizeEndUser(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as err:
                if err.code() not in _UNREACHABLE:
                    raise
                failures.append(f"{report.region}: {' '.join((err.details() or '').split())}")
                continue
        return EndUserPseudonym(answer.pseudonym, answer.zone, report.region)
    raise AdminError(
        f"no region of zone {found.zone!r} could be reached for the end user's pseudonym "
        f"({'; '.join(failures)})",
        "REGION_UNAVAILABLE",
        1,
    )
