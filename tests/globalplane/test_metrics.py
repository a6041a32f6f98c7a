"""The global plane's /metrics over HTTP: usage ingested and its lag, policy
lookups, routing decisions and refusals, and the region directory, on a real
server on loopback port 0 (a manual clock, so heartbeat ages are exact)."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.server import GlobalPlane, start_global_plane
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    common_pb2,
    geo_routing_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb
from tests.globalplane.manual_clock import ManualClock

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def plane() -> AsyncIterator[tuple[GlobalPlane, ManualClock]]:
    clock = ManualClock()
    running = await start_global_plane(
        GlobalSettings(dev_zone="eu", database_url="sqlite://", insecure=True), clock
    )
    yield running, clock
    await running.stop(0)


def scrape(plane: GlobalPlane) -> list[Sample]:
    assert plane.metrics is not None
    with urllib.request.urlopen(plane.metrics.url, timeout=5) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return float(found[0])


async def test_the_global_plane_counts_what_it_serves(plane: tuple[GlobalPlane, ManualClock]) -> None:
    glob, clock = plane
    before = scrape(glob)
    dev = await glob.tenants.get_tenant("dev")
    async with open_channel(glob.address) as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError):
            await geo.Route(gpb.RouteRequest(tenant_id=dev.id))
        report = gpb.RegionReport(
            region="eu-west",
            zone="eu",
            chat_address="eu-west:50051",
            health=common_pb2.HEALTH_STATE_SERVING,
            capacity=4,
            models=["llmmesh-tiny"],
            location=common_pb2.GeoPoint(latitude=53.3, longitude=-6.3),
            engine_pods=1,
        )
        await geo.Heartbeat(gpb.HeartbeatRequest(report=report))
        await geo.Route(gpb.RouteRequest(tenant_id=dev.id, model="llmmesh-tiny"))
        await policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret="sk-llmmesh-dev"))
        with pytest.raises(grpc.aio.AioRpcError):
            await policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret="sk-not-a-key"))
        first = await policy.GetPolicySnapshot(ppb.GetPolicySnapshotRequest(zone="eu"))
        await policy.GetPolicySnapshot(
            ppb.GetPolicySnapshotRequest(zone="eu", known_version=first.snapshot.version)
        )
        ended = timestamp_pb2.Timestamp()
        ended.FromDatetime(clock() - timedelta(seconds=30))
        record = bpb.UsageRecord(
            request_id="req_m1",
            tenant_id=dev.id,
            model="llmmesh-tiny",
            region="eu-west",
            usage=common_pb2.TokenUsage(input_tokens=10, output_tokens=5),
            end_time=ended,
        )
        await billing.RecordUsage(bpb.RecordUsageRequest(records=[record, record]))
    clock.advance(seconds=2)
    after = scrape(glob)

    def grew(name: str, **labels: str) -> float:
        old = [s for s in before if s.name == name and labels.items() <= s.labels.items()]
        return value(after, name, **labels) - (float(old[0].value) if old else 0.0)

    assert grew("llmmesh_global_routing_refusals_total", reason="NO_REGION_IN_ZONE") == 1
    assert grew("llmmesh_global_routing_decisions_total", zone="eu", region="eu-west") == 1
    assert grew("llmmesh_global_policy_lookups_total", method="AuthenticateKey", outcome="ok") == 1
    assert (
        grew("llmmesh_global_policy_lookups_total", method="AuthenticateKey", outcome="API_KEY_INVALID") == 1
    )
    assert grew("llmmesh_global_policy_lookups_total", method="GetPolicySnapshot", outcome="ok") == 1
    assert (
        grew("llmmesh_global_policy_lookups_total", method="GetPolicySnapshot", outcome="not_modified") == 1
    )
    assert grew("llmmesh_global_usage_records_total", outcome="accepted") == 1
    assert grew("llmmesh_global_usage_records_total", outcome="duplicate") == 1
    # One lag observation per record received (on the wall clock, not the plane's).
    assert grew("llmmesh_global_billing_lag_seconds_count") == 2
    assert value(after, "llmmesh_global_regions", zone="eu", health="serving") == 1
    assert value(after, "llmmesh_global_regions", zone="eu", health="down") == 0
    assert value(after, "llmmesh_global_region_heartbeat_age_seconds", zone="eu", region="eu-west") == 2
