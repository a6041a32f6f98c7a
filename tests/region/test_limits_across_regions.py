"""A key's rate limits across the regions of its zone: regions that share
one Redis count the key once, however its turns are spread over them; with
Redis unreachable each region counts alone, so the key gets its limit per
region, and no more. A tenant's monthly quota holds across them too.
Real gRPC servers in this process, turns sent straight to each region's
ChatService (no edge)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from redis.asyncio import Redis

from llmmesh.core.errors import DOMAIN, Reason
from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.multiregion import MultiRegionMesh, RegionSpec, running_multiregion

pytestmark = pytest.mark.asyncio

FAST_POD: dict[str, object] = {
    "context_window": 512,
    "sim_inter_token_s": 0.0005,
    "sim_prefill_per_token_s": 0.000001,
    "sim_prefill_overhead_s": 0.0001,
}
# Nothing listens on port 1: a Redis that is down.
DOWN_REDIS = "redis://127.0.0.1:1/0"


@dataclass
class Refusal:
    """What a refused turn's status carried."""

    code: grpc.StatusCode
    infos: list[error_details_pb2.ErrorInfo]
    retry_delay_s: float | None


@dataclass
class Outcome:
    region: str
    finished: bool = False
    refusal: Refusal | None = None


def _refusal(err: grpc.aio.AioRpcError) -> Refusal:
    infos: list[error_details_pb2.ErrorInfo] = []
    retry: float | None = None
    status = rpc_status.from_call(err)
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            delay = error_details_pb2.RetryInfo()
            detail.Unpack(delay)
            retry = delay.retry_delay.ToMilliseconds() / 1000
    return Refusal(err.code(), infos, retry)


async def turn(
    mesh: MultiRegionMesh, region: str, secret: str, sampling: common_pb2.SamplingParams | None = None
) -> Outcome:
    request = chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Hi!")],
            sampling=sampling or common_pb2.SamplingParams(max_tokens=2),
        )
    )
    outcome = Outcome(region)
    async with open_channel(mesh.plane(region).address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
            metadata=(("authorization", f"Bearer {secret}"),), timeout=30
        )
        await call.write(request)
        await call.done_writing()
        try:
            async for event in call:
                outcome.finished = outcome.finished or event.HasField("finished")
        except grpc.aio.AioRpcError as err:
            outcome.refusal = _refusal(err)
    return outcome


async def limited_key(mesh: MultiRegionMesh, rpm: int) -> tuple[str, str]:
    """A new tenant of zone us with ``rpm``, and one of its keys: (key id,
    secret), known to every region of the zone when this returns."""
    book = mesh.global_plane.tenants
    tenant = await book.create_tenant(f"t-{uuid.uuid4().hex[:10]}", "us", TenantTier.PRO, rpm_limit=rpm)
    key, secret = await book.create_api_key(tenant.id)
    for running in mesh.zone_regions("us"):
        assert await running.plane.policy.refresh()
    return key.id, secret


def region_names() -> list[str]:
    """Two region names of this test alone: their prefix-index keys in the
    shared Redis are its own."""
    suffix = uuid.uuid4().hex[:8]
    return [f"us-a{suffix}", f"us-b{suffix}"]


@asynccontextmanager
async def two_regions(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[MultiRegionMesh, list[str]]]:
    """Two regions of zone us on one zone store, both on ``redis_url``."""
    names = region_names()
    specs = [RegionSpec(name, "us", engine=FAST_POD, settings={"redis_url": redis_url}) for name in names]
    async with running_multiregion(specs, store_dir=tmp_path) as mesh:
        yield mesh, names


@pytest_asyncio.fixture
async def redis_keys(redis_url: str) -> AsyncIterator[list[str]]:
    """Patterns of the Redis keys a test made, deleted afterwards."""
    patterns: list[str] = []
    yield patterns
    client = Redis.from_url(redis_url)
    try:
        for pattern in patterns:
            keys = [key async for key in client.scan_iter(match=pattern)]
            if keys:
                await client.delete(*keys)
    finally:
        await client.aclose()


async def alternate(mesh: MultiRegionMesh, names: Sequence[str], secret: str, turns: int) -> list[Outcome]:
    """``turns`` turns of one key, one at a time, to each region in turn."""
    return [await turn(mesh, names[n % len(names)], secret) for n in range(turns)]


def assert_rate_limited(refusal: Refusal) -> None:
    assert refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(refusal.infos) == 1
    info = refusal.infos[0]
    assert (info.domain, info.reason) == (DOMAIN, Reason.RATE_LIMITED)
    assert info.metadata["limit"] == "requests" and info.metadata["limit_value"] == "10"
    assert refusal.retry_delay_s is not None and 0 < refusal.retry_delay_s <= 61


@pytest.mark.services
async def test_rpm_holds_per_key_across_the_regions_of_a_zone(
    tmp_path: Path, redis_url: str, redis_keys: list[str]
) -> None:
    async with two_regions(tmp_path, redis_url) as (mesh, names):
        redis_keys.extend(f"llmmesh:{name}:kv*" for name in names)
        key_id, secret = await limited_key(mesh, rpm=10)
        redis_keys.append(f"llmmesh:us:rl:{key_id}")
        outcomes = await alternate(mesh, names, secret, 20)
    served = [o for o in outcomes if o.refusal is None]
    assert len(served) == 10 and all(o.finished for o in served)
    # Both regions served, and the first ten turns were the ones let through.
    assert {o.region for o in served} == set(names)
    assert outcomes[:10] == served
    for outcome in outcomes[10:]:
        assert outcome.refusal is not None
        assert_rate_limited(outcome.refusal)


async def test_with_redis_down_each_region_limits_alone(tmp_path: Path) -> None:
    async with two_regions(tmp_path, DOWN_REDIS) as (mesh, names):
        _, secret = await limited_key(mesh, rpm=10)
        outcomes = await alternate(mesh, names, secret, 30)
    served = [o for o in outcomes if o.refusal is None]
    # The documented bound: the key's limit once per region, and no more.
    assert len(served) == 20
    for name in names:
        assert sum(1 for o in served if o.region == name) == 10
    for outcome in outcomes:
        if outcome.refusal is not None:
            assert_rate_limited(outcome.refusal)


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
async def test_a_monthly_quota_holds_across_the_regions_of_a_zone(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """Eight concurrent turns of up to 400 tokens against a 2,000-token quota,
    four at each of two regions: the zone store counts every region's running
    turns as it accepts one, so the month ends at most one turn past the
    quota (each region alone would have admitted its four: 3,200 and more).
    On PostgreSQL the acceptances of one tenant take turns on an advisory lock."""
    names = region_names()
    specs = [RegionSpec(name, "us", engine=FAST_POD) for name in names]
    urls = {"us": request.getfixturevalue("postgres_schema_url")} if store == "postgresql" else {}
    async with running_multiregion(specs, store_dir=tmp_path, store_urls=urls) as mesh:
        book = mesh.global_plane.tenants
        tenant = await book.create_tenant(
            f"t-{uuid.uuid4().hex[:10]}", "us", TenantTier.PRO, monthly_token_quota=2000
        )
        _, secret = await book.create_api_key(tenant.id)
        for running in mesh.zone_regions("us"):
            assert await running.plane.policy.refresh()
        sampling = common_pb2.SamplingParams(max_tokens=400, ignore_eos=True)
        outcomes = await asyncio.gather(*(turn(mesh, names[n % 2], secret, sampling) for n in range(8)))
        for region in mesh.zone_regions("us"):
            await region.plane.gateway.drain()
        billed = await mesh.store("us").tenant_tokens(tenant.id, datetime(2000, 1, 1, tzinfo=UTC))
    finished = [o for o in outcomes if o.finished]
    refused = [o.refusal for o in outcomes if o.refusal is not None]
    assert len(finished) + len(refused) == 8
    assert refused and all(r.code == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
    assert all(any(i.reason == Reason.QUOTA_EXCEEDED.value for i in r.infos) for r in refused)
    # Both regions admitted turns; the month ends at most one turn (its prompt and 400) past the quota.
    assert {o.region for o in finished} == set(names)
    prompt = (billed - 400 * len(finished)) // len(finished)
    assert 2000 <= billed <= 2000 + prompt + 400, billed
