"""Whole-path health: the edge is healthy only when the global plane serves
and some region reaches a serving engine pod."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from llmmesh.core.errors import MeshError
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.v1 import chat_service_pb2, common_pb2, geo_routing_service_pb2

_LIVE = (common_pb2.HEALTH_STATE_SERVING, common_pb2.HEALTH_STATE_DEGRADED)


async def _region_detail(mesh: MeshClient, status: geo_routing_service_pb2.RegionStatus) -> dict[str, object]:
    report = status.report
    detail: dict[str, object] = {
        "zone": report.zone,
        "directory_health": common_pb2.HealthState.Name(status.effective_health),
    }
    try:
        info = await mesh.chat(report.chat_address).GetRegionInfo(
            chat_service_pb2.GetRegionInfoRequest(), timeout=2.0
        )
    except grpc.aio.AioRpcError as err:
        detail.update(reachable=False, error=err.code().name, serving=False)
        return detail
    detail.update(
        reachable=True,
        engine_pods=info.engine_pods,
        healthy_engine_pods=info.healthy_engine_pods,
        serving=info.healthy_engine_pods > 0 and status.effective_health in _LIVE,
    )
    return detail


async def path_health(mesh: MeshClient) -> tuple[bool, dict[str, object]]:
    """Whether edge → region → engine and the global plane are all up, and why."""
    global_ok = await mesh.global_serving()
    regions: dict[str, dict[str, object]] = {}
    if global_ok:
        try:
            statuses = await mesh.list_regions()
        except MeshError:
            statuses = []
            global_ok = False
        details = await asyncio.gather(*(_region_detail(mesh, s) for s in statuses))
        regions = {s.report.region: d for s, d in zip(statuses, details, strict=True)}
    ok = global_ok and any(d.get("serving") for d in regions.values())
    return ok, {"status": "ok" if ok else "unavailable", "global_plane": global_ok, "regions": regions}
