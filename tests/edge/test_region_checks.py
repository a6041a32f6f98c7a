"""The edge trusts its own check of a region over a stale DOWN from geo-routing:
a region the global plane stops listing stays routable while this edge
finds it serving, and goes as soon as a turn fails there or a check does not pass."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from grpc_status import rpc_status

from llmmesh.core.errors import FailedPrecondition, MeshError, Reason
from llmmesh.edge.mesh_client import MeshClient, RouteOptions
from llmmesh.edge.region_checks import RegionChecks, RegionInfo, place_kept
from llmmesh.v1 import common_pb2, geo_routing_service_pb2

SERVING = common_pb2.HEALTH_STATE_SERVING


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(region: str, zone: str = "us") -> geo_routing_service_pb2.RegionStatus:
    found = geo_routing_service_pb2.RegionStatus()
    found.report.region, found.report.zone, found.report.chat_address = region, zone, f"{region}:1"
    return found


def names(route: list[geo_routing_service_pb2.RegionStatus]) -> list[str]:
    return [s.report.region for s in route]


class Regions:
    """What each region answers the edge's check: its info, or no answer."""

    def __init__(self) -> None:
        self.infos: dict[str, RegionInfo] = {}
        self.asked: list[str] = []
        self.latency_s = 0.0

    def serve(self, at: str, **fields: object) -> None:
        """The region at ``at``'s address answers: it is ``at``, serving, unless ``fields`` say otherwise."""
        info = {"region": at, "zone": "us", "models": ["m"], "healthy_engine_pods": 1, "health": SERVING}
        self.infos[f"{at}:1"] = RegionInfo(**{**info, **fields})  # type: ignore[arg-type]

    async def ask(self, address: str) -> RegionInfo:
        self.asked.append(address)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if address not in self.infos:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no answer"
            )
        return self.infos[address]


def no_load(_: geo_routing_service_pb2.RegionStatus) -> int:
    return 0


def test_a_kept_region_goes_before_the_first_listed_one_running_more_turns() -> None:
    load = {"a": 3, "b": 1, "c": 2}
    listed = [status("a"), status("b")]
    assert names(place_kept(listed, [status("c")], lambda s: load[s.report.region])) == ["c", "a", "b"]
    load["c"] = 5
    assert names(place_kept(listed, [status("c")], lambda s: load[s.report.region])) == ["a", "b", "c"]
    load["c"] = 3  # as busy as the first: behind it
    assert names(place_kept(listed, [status("c")], lambda s: load[s.report.region])) == ["a", "b", "c"]
    assert names(place_kept([], [status("c")], no_load)) == ["c"]


@pytest.mark.asyncio
async def test_a_region_geo_routing_leaves_out_stays_while_the_edge_finds_it_serving() -> None:
    clock, regions = Clock(), Regions()
    checks = RegionChecks(regions.ask, clock, check_ttl_s=1.0, failure_memory_s=10.0)
    regions.serve("us-east")
    previous = [status("us-east"), status("us-west")]
    route = await checks.route([status("us-west")], previous, no_load, "m")
    assert names(route) == ["us-west", "us-east"] and checks.kept == {"us-east"}
    # Its answer is reused for the check's TTL, then asked again.
    assert names(await checks.route([status("us-west")], route, no_load, "m")) == ["us-west", "us-east"]
    assert regions.asked == ["us-east:1"]
    clock.now += 1.0
    regions.serve("us-east", healthy_engine_pods=0)  # the region's own word: no pod serves
    assert names(await checks.route([status("us-west")], route, no_load, "m")) == ["us-west"]
    assert checks.kept == set() and len(regions.asked) == 2
    # Listed again by geo-routing: nothing to check.
    assert names(await checks.route(previous, [status("us-west")], no_load)) == ["us-east", "us-west"]
    assert len(regions.asked) == 2


@pytest.mark.parametrize(
    ("answer", "model"),
    [
        ({"region": "us-west"}, ""),  # another region at that address
        ({"zone": "eu"}, ""),
        ({"health": common_pb2.HEALTH_STATE_DOWN}, ""),
        ({"health": common_pb2.HEALTH_STATE_DRAINING}, ""),
        ({}, "other-model"),
        (None, ""),  # no answer in time
    ],
)
@pytest.mark.asyncio
async def test_only_the_regions_own_answer_that_it_serves_keeps_it(
    answer: dict[str, object] | None, model: str
) -> None:
    regions = Regions()
    if answer is not None:
        regions.serve("us-east", **answer)
    checks = RegionChecks(regions.ask, Clock())
    assert await checks.route([status("us-west")], [status("us-east")], no_load, model) == [status("us-west")]
    assert regions.asked == ["us-east:1"]


@pytest.mark.asyncio
async def test_a_turn_failed_on_the_region_outweighs_its_check_for_a_while() -> None:
    clock, regions = Clock(), Regions()
    checks = RegionChecks(regions.ask, clock, check_ttl_s=1.0, failure_memory_s=10.0)
    regions.serve("us-east")
    checks.failed("us-east")
    assert names(await checks.route([], [status("us-east")], no_load)) == []
    assert regions.asked == []
    clock.now += 10.0
    assert names(await checks.route([], [status("us-east")], no_load)) == ["us-east"]


@pytest.mark.asyncio
async def test_concurrent_checks_of_a_region_share_one_call() -> None:
    regions = Regions()
    regions.serve("us-east")
    regions.latency_s = 0.01
    checks = RegionChecks(regions.ask, Clock())
    found = await asyncio.gather(*(checks.reaches(status("us-east")) for _ in range(5)))
    assert found == [True] * 5 and regions.asked == ["us-east:1"]
    await checks.close()


def no_region_in_zone() -> grpc.aio.AioRpcError:
    """Geo-routing's refusal when no region of the zone is routable, as the wire carries it."""
    refusal = FailedPrecondition(Reason.NO_REGION_IN_ZONE, "no healthy region in zone 'us'")
    status = rpc_status.to_status(refusal.to_status_proto())
    trailing = grpc.aio.Metadata(*status.trailing_metadata)
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), trailing, status.details)


class FakeGeo:
    """Geo-routing that lists ``listed`` of zone us, or refuses with NO_REGION_IN_ZONE."""

    def __init__(self) -> None:
        self.listed = ["us-east", "us-west"]

    async def Route(
        self, request: geo_routing_service_pb2.RouteRequest, **options: float
    ) -> geo_routing_service_pb2.RouteResponse:
        if not self.listed:
            raise no_region_in_zone()
        return geo_routing_service_pb2.RouteResponse(zone="us", regions=[status(r) for r in self.listed])


@pytest.mark.asyncio
async def test_the_edge_keeps_routing_to_a_region_only_the_global_plane_calls_down() -> None:
    clock, regions, geo = Clock(), Regions(), FakeGeo()
    mesh = MeshClient("127.0.0.1:1", clock=clock, routes=RouteOptions(cache_s=1.0, stale_s=1.0))
    mesh.geo = geo  # type: ignore[assignment]
    mesh.region_checks = RegionChecks(regions.ask, clock)
    try:
        assert names(await mesh.route("t1", "")) == ["us-east", "us-west"]
        regions.serve("us-east")
        geo.listed = ["us-west"]  # us-east missed its heartbeats
        clock.now += 1.0
        assert names(await mesh.route("t1", "")) == ["us-west", "us-east"]
        assert names(await mesh.zone_regions("t1")) == ["us-west", "us-east"]
        # The whole zone is DOWN to geo-routing: the regions this edge reaches still serve it.
        geo.listed = []
        clock.now += 1.0
        assert names(await mesh.route("t1", "")) == ["us-east"]
        # A turn that fails there ends it: nothing of the zone is left.
        mesh.forget_region("us-east")
        with pytest.raises(MeshError) as refused:
            await mesh.route("t1", "")
        assert refused.value.reason == Reason.NO_REGION_IN_ZONE
    finally:
        await mesh.close()
