"""A rate-limit refusal carries the key's ``x-ratelimit-*`` figures as
ErrorInfo metadata, for the in-process limiter and the Redis one alike, and
they survive the trip to the edge as a gRPC status and as a stream error."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable

import pytest
import pytest_asyncio
from google.rpc import error_details_pb2
from redis.asyncio import Redis

from llmmesh.core.errors import Reason, ResourceExhausted, from_stream_error
from llmmesh.region.admission.ratelimit import LocalRateLimiter, RateLimiter, RateLimits, Reservation
from llmmesh.region.admission.ratelimit_redis import RedisRateLimiter
from tests.region.test_ratelimit import FakeClock

FIGURES = (
    "limit_requests",
    "remaining_requests",
    "reset_requests_ms",
    "limit_tokens",
    "remaining_tokens",
    "reset_tokens_ms",
)


@pytest_asyncio.fixture
async def redis_limiter(redis_url: str) -> AsyncIterator[tuple[RateLimiter, FakeClock]]:
    """A Redis limiter on a fake clock and a key prefix of its own, deleted afterwards."""
    clock = FakeClock()
    prefix = f"llmmesh:test:rl-figures:{uuid.uuid4().hex}:"
    client = Redis.from_url(redis_url)
    try:
        yield RedisRateLimiter(client, prefix, clock=clock), clock
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(params=["local", "redis"])
def limiter(request: pytest.FixtureRequest) -> tuple[RateLimiter, FakeClock]:
    """Each limiter on a fake clock whose sub-buckets last 1 s (60 s window)."""
    if request.param == "local":
        clock = FakeClock()
        return LocalRateLimiter(clock=clock), clock
    made: tuple[RateLimiter, FakeClock] = request.getfixturevalue("redis_limiter")
    return made


async def refused(call: Awaitable[Reservation]) -> ResourceExhausted:
    with pytest.raises(ResourceExhausted) as info:
        await call
    assert info.value.reason == Reason.RATE_LIMITED
    return info.value


def figures(error: ResourceExhausted) -> dict[str, int]:
    return {name: int(error.metadata[name]) for name in FIGURES}


@pytest.mark.asyncio
async def test_a_request_refusal_reports_the_window_as_found(limiter: tuple[RateLimiter, FakeClock]) -> None:
    rl, clock = limiter
    limits = RateLimits(rpm=2, tpm=1000)
    await rl.reserve("k", limits, 100)
    clock.advance(5.0)
    await rl.reserve("k", limits, 100)
    clock.advance(5.0)
    error = await refused(rl.reserve("k", limits, 100))
    assert error.metadata["limit"] == "requests"
    # The newest request (5 s ago, in its own sub-bucket) leaves the window
    # 61 s after its sub-bucket began: 56 s from now. The oldest leaves in 51 s.
    assert figures(error) == {
        "limit_requests": 2,
        "remaining_requests": 0,
        "reset_requests_ms": 56_000,
        "limit_tokens": 1000,
        "remaining_tokens": 800,
        "reset_tokens_ms": 56_000,
    }
    assert error.retry_after_s == 51.0


@pytest.mark.asyncio
async def test_a_token_refusal_reports_the_tokens_still_left(limiter: tuple[RateLimiter, FakeClock]) -> None:
    rl, clock = limiter
    limits = RateLimits(rpm=10, tpm=1000)
    await rl.reserve("k", limits, 700)
    clock.advance(2.0)
    error = await refused(rl.reserve("k", limits, 400))
    assert (error.metadata["limit"], error.metadata["requested"]) == ("tokens", "400")
    # Nothing of the refused request is counted: 300 tokens are left, fewer than it asked for.
    assert figures(error) == {
        "limit_requests": 10,
        "remaining_requests": 9,
        "reset_requests_ms": 59_000,
        "limit_tokens": 1000,
        "remaining_tokens": 300,
        "reset_tokens_ms": 59_000,
    }
    # A request that fits in what the refusal reported passes.
    assert (await rl.reserve("k", limits, 300)).remaining_tokens == 0


@pytest.mark.asyncio
async def test_a_refusal_right_after_an_admission_reports_what_the_admission_did(
    limiter: tuple[RateLimiter, FakeClock],
) -> None:
    rl, clock = limiter
    limits = RateLimits(rpm=3, tpm=500)
    clock.advance(0.25)  # mid sub-bucket, so resets are not whole seconds
    for _ in range(2):
        await rl.reserve("k", limits, 100)
    last = await rl.reserve("k", limits, 100)
    error = await refused(rl.reserve("k", limits, 100))
    assert figures(error) == {
        "limit_requests": last.limit_requests,
        "remaining_requests": last.remaining_requests,
        "reset_requests_ms": round(last.reset_requests_s * 1000),
        "limit_tokens": last.limit_tokens,
        "remaining_tokens": last.remaining_tokens,
        "reset_tokens_ms": round(last.reset_tokens_s * 1000),
    }
    assert figures(error)["reset_requests_ms"] == 60_750


@pytest.mark.asyncio
async def test_an_unlimited_dimension_reports_a_limit_of_zero(limiter: tuple[RateLimiter, FakeClock]) -> None:
    rl, _ = limiter
    limits = RateLimits(tpm=100)
    await rl.reserve("k", limits, 100)
    error = await refused(rl.reserve("k", limits, 1))
    assert (error.metadata["limit_requests"], error.metadata["remaining_requests"]) == ("0", "0")
    assert (error.metadata["limit_tokens"], error.metadata["remaining_tokens"]) == ("100", "0")
    assert error.metadata["reset_tokens_ms"] == "61000"


@pytest.mark.asyncio
async def test_a_request_larger_than_the_whole_limit_carries_no_figures() -> None:
    error = await refused(LocalRateLimiter().reserve("k", RateLimits(rpm=5, tpm=100), 101))
    assert not set(FIGURES) & set(error.metadata)


@pytest.mark.asyncio
async def test_the_figures_travel_as_grpc_status_and_as_stream_error(
    limiter: tuple[RateLimiter, FakeClock],
) -> None:
    rl, _ = limiter
    limits = RateLimits(rpm=1, tpm=50)
    await rl.reserve("k", limits, 20)
    error = await refused(rl.reserve("k", limits, 20))
    info = error_details_pb2.ErrorInfo()
    assert error.to_status_proto().details[0].Unpack(info)
    assert dict(info.metadata) == error.metadata
    again = from_stream_error(error.to_stream_error())
    assert (again.reason, again.metadata) == (error.reason, error.metadata)
    assert again.metadata["remaining_tokens"] == "30"
