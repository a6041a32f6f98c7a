"""One unary call on the regions of a tenant's zone: the first region
geo-routing names, the next only when one is unreachable (UNAVAILABLE). It
never leaves the zone: geo-routing names only the tenant's zone's regions,
and with none left the call fails (503, or 403 ``NO_REGION_IN_ZONE`` when
the zone serves none)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
import grpc.aio

from llmmesh.core.errors import MeshError, Reason, Unavailable, from_rpc_error
from llmmesh.edge.mesh_client import MeshClient, Metadata, Principal
from llmmesh.v1 import geo_routing_service_pb2

T = TypeVar("T")

RegionCall = Callable[[grpc.aio.Channel, Metadata], Awaitable[T]]
"""A call on one region's channel, with the caller's metadata."""


async def call_in_zone(
    mesh: MeshClient,
    principal: Principal,
    regions: Sequence[geo_routing_service_pb2.RegionStatus],
    call: RegionCall[T],
) -> tuple[T, str]:
    """``call``'s answer and the region that gave it, trying ``regions`` in
    order; any failure but UNAVAILABLE is the answer, raised as MeshError."""
    last_error: MeshError | None = None
    metadata: Metadata = (("authorization", f"Bearer {principal.secret}"),)
    for region in regions:
        channel = mesh.region_channel(region.report.chat_address)
        try:
            return await call(channel, metadata), region.report.region
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise from_rpc_error(err) from err
            mesh.forget_region(region.report.region)
            last_error = from_rpc_error(err)
    raise last_error or Unavailable(Reason.NO_REGION_IN_ZONE, "no region of the zone is serving")
