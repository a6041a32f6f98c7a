"""Regions' heartbeats in the global store: a restarted global plane routes at
once, replicas on one store route on the heartbeats any of them received,
and an operator removes a region for good (audited)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.protoconv import health_from_proto
from llmmesh.globalplane.region_directory import GeoPoint, RegionHealth, RegionReport
from llmmesh.globalplane.region_reports import RegionReportBook
from llmmesh.globalplane.server import GlobalPlane, start_global_plane
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.v1 import common_pb2, geo_routing_service_pb2_grpc, policy_service_pb2_grpc
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb
from tests.globalplane.manual_clock import ManualClock

DEV_KEY = "sk-llmmesh-reports"
SEEN = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)


def _report(region: str, health: RegionHealth = RegionHealth.SERVING) -> RegionReport:
    return RegionReport(
        region, "us", f"10.0.0.7:{len(region)}", health, 8, 1, ("m",), GeoPoint(39.0, -77.5), 2, 1
    )


@pytest.mark.asyncio
async def test_the_book_keeps_each_regions_last_heartbeat(store: GlobalStore) -> None:
    book = RegionReportBook(store)
    await book.save(_report("us-east"), SEEN)
    await book.save(_report("us-west"), SEEN)
    await book.save(_report("us-east", RegionHealth.DEGRADED), SEEN + timedelta(seconds=1))
    kept = await book.load()
    assert [(r.region, r.health, t) for r, t in kept] == [
        ("us-east", RegionHealth.DEGRADED, SEEN + timedelta(seconds=1)),
        ("us-west", RegionHealth.SERVING, SEEN),
    ]
    assert kept[0][0] == _report("us-east", RegionHealth.DEGRADED)
    assert await book.delete("us-east") is True
    assert await book.delete("us-east") is False
    assert [r.region for r, _ in await book.load()] == ["us-west"]


def _settings(tmp_path: Path, url: str = "") -> GlobalSettings:
    url = url or f"sqlite:///{tmp_path / 'global.db'}"
    return GlobalSettings(port=0, insecure=True, database_url=url, dev_key=DEV_KEY, metrics_port=-1)


async def _heartbeat(plane: GlobalPlane, region: str) -> None:
    report = gpb.RegionReport(
        region=region,
        zone="us",
        chat_address=f"10.0.0.7:{len(region)}",
        health=common_pb2.HEALTH_STATE_SERVING,
        capacity=8,
        models=["llmmesh-tiny"],
        engine_pods=2,
        healthy_engine_pods=1,
        model_pods=[gpb.ModelPods(model="llmmesh-tiny", engine_pods=1, healthy_engine_pods=1)],
    )
    async with open_channel(plane.address) as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        await geo.Heartbeat(gpb.HeartbeatRequest(report=report), timeout=10)


async def _route(plane: GlobalPlane) -> list[str]:
    async with open_channel(plane.address) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        found = await policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret=DEV_KEY), timeout=10)
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        routed = await geo.Route(gpb.RouteRequest(tenant_id=found.tenant.id), timeout=10)
    return [s.report.region for s in routed.regions]


@pytest.mark.asyncio
async def test_a_restarted_global_plane_routes_at_once_and_forgets_removed_regions(tmp_path: Path) -> None:
    plane = await start_global_plane(_settings(tmp_path))
    try:
        await _heartbeat(plane, "us-east")
        await _heartbeat(plane, "us-west")
        async with open_channel(plane.address) as channel:
            geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
            removed = await geo.RemoveRegion(gpb.RemoveRegionRequest(region="us-west"), timeout=10)
            assert removed.region.report.region == "us-west"
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await geo.RemoveRegion(gpb.RemoveRegionRequest(region="us-west"), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert from_rpc_error(missing.value).reason == "REGION_NOT_FOUND"
        events = await AuditLog(plane.store).list(100)
        assert [(e.method, e.target) for e in events] == [("RemoveRegion", "us-west")]
    finally:
        await plane.stop()
    # A killed and restarted global plane: no region has reported to it yet.
    restarted = await start_global_plane(_settings(tmp_path))
    try:
        assert await _route(restarted) == ["us-east"]
    finally:
        await restarted.stop()


async def _health(plane: GlobalPlane) -> dict[str, RegionHealth]:
    async with open_channel(plane.address) as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        listed = await geo.ListRegions(gpb.ListRegionsRequest(), timeout=10)
    return {s.report.region: health_from_proto(s.effective_health) for s in listed.regions}


@pytest.mark.asyncio
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
async def test_replicas_on_one_store_route_on_the_heartbeats_any_of_them_received(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("postgres_schema_url") if database == "postgresql" else ""
    clock = ManualClock()
    interval = timedelta(milliseconds=_settings(tmp_path).heartbeat_interval_ms)
    a = await start_global_plane(_settings(tmp_path, url), clock)
    b = await start_global_plane(_settings(tmp_path, url), clock)
    running = [a, b]
    try:
        # us-east's connection reaches replica A only; within an interval B routes it too.
        await _heartbeat(a, "us-east")
        clock.advance(seconds=interval.total_seconds())
        assert await _route(b) == ["us-east"]
        assert b.directory.status("us-east") == a.directory.status("us-east")
        # us-west reports to B only; us-east falls silent. A hears no region
        # itself, yet is not deaf: the store's heartbeats are its peers' hearing.
        for _ in range(a.directory.missed_until_down - 1):
            clock.advance(seconds=interval.total_seconds())
            await _heartbeat(b, "us-west")
        silent = a.directory.status("us-east")
        assert silent is not None and clock() - silent.last_heartbeat_time == a.directory.down_after
        for plane in (a, b):
            assert await _health(plane) == {"us-east": RegionHealth.DOWN, "us-west": RegionHealth.SERVING}
            assert await _route(plane) == ["us-west"]
        await running.pop().stop()
        # A restarted replica starts from the store: us-west routed, us-east still DOWN.
        b = await start_global_plane(_settings(tmp_path, url), clock)
        running.append(b)
        assert await _health(b) == {"us-east": RegionHealth.DOWN, "us-west": RegionHealth.SERVING}
        assert await _route(b) == ["us-west"]
    finally:
        for plane in running:
            await plane.stop()
