"""The global plane's services on a real ``grpc.aio`` server, on loopback port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.core.end_user import end_user_pseudonym
from llmmesh.core.errors import MeshError, Reason, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.server import SERVICE_NAMES, GlobalPlane, start_global_plane
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    common_pb2,
    geo_routing_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import model_registry_service_pb2 as mpb
from llmmesh.v1 import policy_service_pb2 as ppb
from tests.globalplane.manual_clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def plane(clock: ManualClock) -> AsyncIterator[GlobalPlane]:
    running = await start_global_plane(
        GlobalSettings(dev_zone="eu", database_url="sqlite://", insecure=True), clock
    )
    yield running
    await running.stop(0)


@pytest_asyncio.fixture
async def channel(plane: GlobalPlane) -> AsyncIterator[grpc.aio.Channel]:
    async with open_channel(plane.address) as chan:
        yield chan


async def _fails(call: Awaitable[object]) -> MeshError:
    """The MeshError a call ended with; fails the test if it succeeded."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return from_rpc_error(info.value)


@pytest.mark.asyncio
async def test_health_reports_every_service(plane: GlobalPlane, channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for name in ["", *SERVICE_NAMES]:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.asyncio
async def test_dev_key_authenticates(plane: GlobalPlane, channel: grpc.aio.Channel) -> None:
    policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
    reply = await policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret=plane.settings.dev_key))
    assert (reply.tenant.name, reply.tenant.zone, reply.tenant.tier) == ("dev", "eu", common_pb2.TIER_PRO)
    err = await _fails(policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret="sk-llmmesh-wrong")))
    assert (err.code, err.reason) == (grpc.StatusCode.UNAUTHENTICATED, Reason.API_KEY_INVALID)


@pytest.mark.asyncio
async def test_no_dev_tenant_without_dev_key() -> None:
    plane = await start_global_plane(GlobalSettings(dev_key="", database_url="sqlite://", insecure=True))
    try:
        assert (await plane.tenants.list_tenants()).items == []
    finally:
        await plane.stop(0)


@pytest.mark.asyncio
async def test_tenant_lifecycle_and_errors(
    plane: GlobalPlane, channel: grpc.aio.Channel, clock: ManualClock
) -> None:
    policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
    spec = ppb.Tenant(name="acme", zone="eu", tier=common_pb2.TIER_FREE, rpm_limit=5)
    created = (await policy.CreateTenant(ppb.CreateTenantRequest(tenant=spec))).tenant
    assert created.id.startswith("ten_")
    assert created.HasField("create_time")

    dup = await _fails(policy.CreateTenant(ppb.CreateTenantRequest(tenant=spec)))
    assert (dup.code, dup.reason) == (grpc.StatusCode.ALREADY_EXISTS, Reason.TENANT_EXISTS)
    bad = ppb.Tenant(name="x", zone="eu", tier=common_pb2.TIER_FREE, tpm_limit=-1)
    neg = await _fails(policy.CreateTenant(ppb.CreateTenantRequest(tenant=bad)))
    assert (neg.code, neg.metadata["param"]) == (grpc.StatusCode.INVALID_ARGUMENT, "tpm_limit")
    missing = await _fails(policy.GetTenant(ppb.GetTenantRequest(tenant="nobody")))
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, Reason.TENANT_NOT_FOUND)

    change = ppb.Tenant(id=created.id, tier=common_pb2.TIER_ENTERPRISE, zone="us")
    updated = await policy.UpdateTenant(ppb.UpdateTenantRequest(tenant=change, update_fields=["tier"]))
    assert (updated.tenant.tier, updated.tenant.zone) == (common_pb2.TIER_ENTERPRISE, "eu")
    moved = await _fails(policy.UpdateTenant(ppb.UpdateTenantRequest(tenant=change, update_fields=["zone"])))
    assert (moved.code, moved.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.WRONG_ZONE)
    odd = await _fails(policy.UpdateTenant(ppb.UpdateTenantRequest(tenant=change, update_fields=["id"])))
    assert odd.metadata["param"] == "update_fields"

    listed = await policy.ListTenants(ppb.ListTenantsRequest(zone="eu", page_size=1))
    assert [t.name for t in listed.tenants] == ["acme"]
    assert listed.next_page_token


@pytest.mark.asyncio
async def test_keys_and_snapshots(plane: GlobalPlane, channel: grpc.aio.Channel, clock: ManualClock) -> None:
    policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
    expire = timestamp_pb2.Timestamp()
    expire.FromDatetime(clock.now.replace(year=clock.now.year + 1))
    made = await policy.CreateApiKey(ppb.CreateApiKeyRequest(tenant="dev", expire_time=expire))
    assert made.secret
    assert made.api_key.display_prefix == made.secret[: len(made.api_key.display_prefix)]
    snap = (await policy.GetPolicySnapshot(ppb.GetPolicySnapshotRequest(zone="eu"))).snapshot
    assert {k.key_id for k in snap.keys} >= {made.api_key.id}
    assert all(len(k.secret_sha256) == 64 for k in snap.keys)
    same = await policy.GetPolicySnapshot(ppb.GetPolicySnapshotRequest(zone="eu", known_version=snap.version))
    assert same.not_modified
    assert not same.HasField("snapshot")

    await policy.RevokeApiKey(ppb.RevokeApiKeyRequest(key_id=made.api_key.id))
    revoked = await _fails(policy.AuthenticateKey(ppb.AuthenticateKeyRequest(secret=made.secret)))
    assert revoked.reason == Reason.API_KEY_REVOKED
    newer = await policy.GetPolicySnapshot(
        ppb.GetPolicySnapshotRequest(zone="eu", known_version=snap.version)
    )
    assert newer.snapshot.version > snap.version
    unknown = await _fails(policy.RevokeApiKey(ppb.RevokeApiKeyRequest(key_id="key_x")))
    assert (unknown.code, unknown.reason) == (grpc.StatusCode.NOT_FOUND, Reason.KEY_NOT_FOUND)
    keys = await policy.ListApiKeys(ppb.ListApiKeysRequest(tenant="dev"))
    assert len(keys.api_keys) == 2


@pytest.mark.asyncio
async def test_billing_round_trip(plane: GlobalPlane, channel: grpc.aio.Channel) -> None:
    billing = billing_service_pb2_grpc.BillingServiceStub(channel)
    dev = await plane.tenants.get_tenant("dev")
    record = bpb.UsageRecord(
        request_id="req_1",
        tenant_id=dev.id,
        model="llmmesh-tiny",
        region="eu-west",
        usage=common_pb2.TokenUsage(input_tokens=1000, output_tokens=1000),
    )
    first = await billing.RecordUsage(bpb.RecordUsageRequest(records=[record, record]))
    assert (first.accepted, first.duplicates) == (1, 1)
    usage = await billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id))
    assert (usage.cost_usd, usage.requests, usage.period) == ("0.002", 1, "2031-05")
    gaps = await billing.ReconcileUsage(
        bpb.ReconcileUsageRequest(region="eu-west", request_ids=["req_1", "req_2"])
    )
    assert list(gaps.missing_request_ids) == ["req_2"]
    period = await _fails(billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id, period="2031-5")))
    assert period.code == grpc.StatusCode.INVALID_ARGUMENT
    empty = bpb.UsageRecord(tenant_id=dev.id, model="llmmesh-tiny")
    no_id = await _fails(billing.RecordUsage(bpb.RecordUsageRequest(records=[empty])))
    assert (no_id.code, no_id.metadata["param"]) == (grpc.StatusCode.INVALID_ARGUMENT, "request_id")


@pytest.mark.asyncio
async def test_billing_keeps_and_filters_by_end_user(plane: GlobalPlane, channel: grpc.aio.Channel) -> None:
    billing = billing_service_pb2_grpc.BillingServiceStub(channel)
    dev = await plane.tenants.get_tenant("dev")
    records = [
        bpb.UsageRecord(
            request_id=f"req_{user or 'none'}",
            tenant_id=dev.id,
            model="llmmesh-tiny",
            region="eu-west",
            usage=common_pb2.TokenUsage(input_tokens=tokens, output_tokens=tokens),
            end_user=end_user_pseudonym(b"k" * 32, dev.id, user),
        )
        for user, tokens in (("user-a", 10), ("user-b", 20), ("", 40))
    ]
    await billing.RecordUsage(bpb.RecordUsageRequest(records=records))
    b = end_user_pseudonym(b"k" * 32, dev.id, "user-b")
    one = await billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id, end_user=b))
    assert (one.requests, one.input_tokens, one.output_tokens) == (1, 20, 20)
    everyone = await billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id))
    assert (everyone.requests, everyone.input_tokens) == (3, 70)
    bad = await _fails(billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id, end_user="a\x00b")))
    assert (bad.code, bad.metadata["param"]) == (grpc.StatusCode.INVALID_ARGUMENT, "end_user")
    # A raw end-user id never leaves its zone: billing is asked by pseudonym only.
    raw = await _fails(billing.GetUsage(bpb.GetUsageRequest(tenant_id=dev.id, end_user="user-b")))
    assert (raw.code, raw.reason, raw.metadata["param"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "END_USER_NOT_PSEUDONYMOUS",
        "end_user",
    )
    assert "pseudonymous outside their zone" in raw.message
    record = bpb.UsageRecord(request_id="req_raw", tenant_id=dev.id, model="llmmesh-tiny", end_user="zed")
    refused = await _fails(billing.RecordUsage(bpb.RecordUsageRequest(records=[record])))
    assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "END_USER_NOT_PSEUDONYMOUS")


@pytest.mark.asyncio
async def test_model_registry(plane: GlobalPlane, channel: grpc.aio.Channel) -> None:
    registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)
    auto = await registry.ResolveModel(mpb.ResolveModelRequest(name="auto", tenant_tier=common_pb2.TIER_FREE))
    assert auto.model.name == "llmmesh-tiny"
    assert auto.model.pricing.input_per_1k_usd == "0.0005"
    big = mpb.Model(
        name="llmmesh-big",
        tier=mpb.MODEL_TIER_LARGE,
        context_window=8192,
        pricing=mpb.ModelPricing(input_per_1k_usd="0.01", output_per_1k_usd="0.02"),
        allowed_tiers=[common_pb2.TIER_ENTERPRISE],
    )
    await registry.UpsertModel(mpb.UpsertModelRequest(model=big))
    denied = await _fails(
        registry.ResolveModel(mpb.ResolveModelRequest(name="llmmesh-big", tenant_tier=common_pb2.TIER_PRO))
    )
    assert (denied.code, denied.reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.MODEL_NOT_ALLOWED)
    unknown = await _fails(registry.GetModel(mpb.GetModelRequest(name="nope")))
    assert (unknown.code, unknown.reason) == (grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_MODEL)
    bad = mpb.Model(name="x", tier=mpb.MODEL_TIER_SMALL, context_window=1, pricing=mpb.ModelPricing())
    bad.pricing.input_per_1k_usd = "free"
    invalid = await _fails(registry.UpsertModel(mpb.UpsertModelRequest(model=bad)))
    assert invalid.metadata["param"] == "pricing.input_per_1k_usd"
    listed = await registry.ListModels(mpb.ListModelsRequest())
    assert [m.name for m in listed.models] == ["llmmesh-big", "llmmesh-tiny", "llmmesh-tiny-embed"]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["x" * 20_000, "m" * 129, "no spaces", "-leading", "nul\x00"])
async def test_a_name_no_model_could_have_is_an_invalid_argument(
    channel: grpc.aio.Channel, name: str
) -> None:
    registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)
    for call in (
        registry.GetModel(mpb.GetModelRequest(name=name)),
        registry.ResolveModel(mpb.ResolveModelRequest(name=name, tenant_tier=common_pb2.TIER_FREE)),
    ):
        # Not the RESOURCE_EXHAUSTED of a status whose message echoes the name past gRPC's limits.
        refused = await _fails(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST)
        assert refused.metadata["param"] == "name" and len(refused.message) < 300


@pytest.mark.asyncio
async def test_geo_routing(plane: GlobalPlane, channel: grpc.aio.Channel, clock: ManualClock) -> None:
    geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
    registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)
    dev = await plane.tenants.get_tenant("dev")
    none = await _fails(geo.Route(gpb.RouteRequest(tenant_id=dev.id)))
    assert (none.code, none.reason) == (grpc.StatusCode.FAILED_PRECONDITION, Reason.NO_REGION_IN_ZONE)
    assert none.metadata["zone"] == "eu"

    for region, zone in [("eu-west", "eu"), ("us-east", "us")]:
        report = gpb.RegionReport(
            region=region,
            zone=zone,
            chat_address=f"{region}:50051",
            health=common_pb2.HEALTH_STATE_SERVING,
            capacity=4,
            models=["llmmesh-tiny"],
            location=common_pb2.GeoPoint(latitude=53.3, longitude=-6.3),
            engine_pods=3,
        )
        beat = await geo.Heartbeat(gpb.HeartbeatRequest(report=report))
        assert (beat.interval_ms, beat.missed_heartbeats_until_down) == (1000, 3)
    routed = await geo.Route(
        gpb.RouteRequest(tenant_id=dev.id, model="llmmesh-tiny", client_location_hint="48,2")
    )
    assert routed.zone == "eu"
    assert [s.report.region for s in routed.regions] == ["eu-west"]
    assert routed.regions[0].report.location.latitude == pytest.approx(53.3)
    model = await registry.GetModel(mpb.GetModelRequest(name="llmmesh-tiny"))
    assert {(d.region, d.engine_pods) for d in model.model.deployments} == {("eu-west", 3), ("us-east", 3)}

    moved = gpb.RegionReport(
        region="eu-west", zone="us", chat_address="x:1", health=common_pb2.HEALTH_STATE_SERVING
    )
    wrong = await _fails(geo.Heartbeat(gpb.HeartbeatRequest(report=moved)))
    assert (wrong.code, wrong.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.WRONG_ZONE)
    hint = await _fails(geo.Route(gpb.RouteRequest(tenant_id=dev.id, client_location_hint="north pole")))
    assert (hint.code, hint.metadata["param"]) == (grpc.StatusCode.INVALID_ARGUMENT, "client_location_hint")

    # eu-west falls silent while us-east keeps reporting.
    us_east = gpb.RegionReport(
        region="us-east", zone="us", chat_address="us-east:50051", health=common_pb2.HEALTH_STATE_SERVING
    )
    for _ in range(3):
        clock.advance(seconds=1)
        await geo.Heartbeat(gpb.HeartbeatRequest(report=us_east))
    listed = await geo.ListRegions(gpb.ListRegionsRequest(zone="eu"))
    assert [s.effective_health for s in listed.regions] == [common_pb2.HEALTH_STATE_DOWN]
    down = await _fails(geo.Route(gpb.RouteRequest(tenant_id=dev.id)))
    assert down.reason == Reason.NO_REGION_IN_ZONE
