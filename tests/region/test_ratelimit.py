"""Per-key RPM/TPM limits: the same contract for the in-process limiter and
the Redis one (real Redis, several "replicas" on one server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from llmmesh.core.errors import ResourceExhausted
from llmmesh.region.admission.ratelimit import (
    LocalRateLimiter,
    RateLimiter,
    RateLimits,
    Reservation,
)
from llmmesh.region.admission.ratelimit_redis import RedisRateLimiter

US = 1_000_000


class FakeClock:
    """Seconds, moved by hand."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakeLimiter = Callable[..., RateLimiter]


@dataclass
class Limiters:
    """Limiters of one kind sharing one fake clock (and, for Redis, one server
    and one key prefix): each made limiter is another gateway replica."""

    make: MakeLimiter
    clock: FakeClock


@pytest_asyncio.fixture
async def redis_clients(redis_url: str) -> AsyncIterator[Callable[[], Redis]]:
    """Fresh Redis clients (one per replica), closed afterwards."""
    clients: list[Redis] = []

    def connect() -> Redis:
        client = Redis.from_url(redis_url)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        await client.aclose()


@pytest_asyncio.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"llmmesh:test:rl:{uuid.uuid4().hex}:"
    yield prefix
    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(params=["local", "redis"])
def limiters(request: pytest.FixtureRequest) -> Iterator[Limiters]:
    clock = FakeClock()
    if request.param == "local":
        # One process has one limiter; "replicas" of it would not share counts.
        shared: dict[tuple[float, int], LocalRateLimiter] = {}

        def make_local(window_s: float = 60.0, buckets: int = 60) -> RateLimiter:
            return shared.setdefault(
                (window_s, buckets), LocalRateLimiter(window_s=window_s, buckets=buckets, clock=clock)
            )

        yield Limiters(make_local, clock)
        return
    connect: Callable[[], Redis] = request.getfixturevalue("redis_clients")
    prefix: str = request.getfixturevalue("redis_prefix")

    def make_redis(window_s: float = 60.0, buckets: int = 60) -> RateLimiter:
        return RedisRateLimiter(connect(), prefix, window_s=window_s, buckets=buckets, clock=clock)

    yield Limiters(make_redis, clock)


async def refused(call: Awaitable[Reservation]) -> ResourceExhausted:
    with pytest.raises(ResourceExhausted) as info:
        await call
    assert info.value.reason == "RATE_LIMITED"
    return info.value


async def attempt(call: Awaitable[Reservation]) -> Reservation | ResourceExhausted:
    try:
        return await call
    except ResourceExhausted as error:
        return error


# ------------------------------------------------------------ both limiters


@pytest.mark.asyncio
async def test_requests_beyond_rpm_are_refused_with_retry_info(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(rpm=3)
    remaining = [(await limiter.reserve("k", limits, 10)).remaining_requests for _ in range(3)]
    assert remaining == [2, 1, 0]

    error = await refused(limiter.reserve("k", limits, 10))
    assert error.metadata["limit"] == "requests"
    assert error.metadata["limit_value"] == "3"
    assert error.retry_after_s is not None
    assert 0 < error.retry_after_s <= limiter.window_s + 1.0

    # RetryInfo is exact: a moment earlier is still too early, and then there is room.
    limiters.clock.advance(error.retry_after_s - 0.01)
    await refused(limiter.reserve("k", limits, 10))
    limiters.clock.advance(0.01)
    # All three shared one sub-bucket, so they left the window together.
    assert (await limiter.reserve("k", limits, 10)).remaining_requests == 2


@pytest.mark.asyncio
async def test_reservation_reports_what_the_ratelimit_headers_need(limiters: Limiters) -> None:
    limiter = limiters.make()
    first = await limiter.reserve("k", RateLimits(rpm=10, tpm=1000), 100)
    assert (first.limit_requests, first.remaining_requests) == (10, 9)
    assert (first.limit_tokens, first.remaining_tokens) == (1000, 900)
    assert first.reserved_tokens == 100
    # The usage just counted leaves the window one window (plus at most one sub-bucket) from now.
    assert 60.0 <= first.reset_requests_s <= 61.0
    assert 60.0 <= first.reset_tokens_s <= 61.0


@pytest.mark.asyncio
async def test_a_refusal_changes_nothing(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(rpm=2, tpm=100)
    await limiter.reserve("k", limits, 80)
    error = await refused(limiter.reserve("k", limits, 50))
    assert error.metadata["limit"] == "tokens"
    assert error.metadata["requested"] == "50"
    # The refused request took neither a request nor tokens.
    last = await limiter.reserve("k", limits, 20)
    assert (last.remaining_requests, last.remaining_tokens) == (0, 0)


@pytest.mark.asyncio
async def test_a_request_larger_than_the_whole_tpm_limit_is_refused_without_retry(
    limiters: Limiters,
) -> None:
    limiter = limiters.make()
    limits = RateLimits(rpm=10, tpm=1000)
    error = await refused(limiter.reserve("k", limits, 1001))
    assert error.retry_after_s is None
    assert "max_tokens" in error.message
    assert error.metadata == {"limit": "tokens", "limit_value": "1000", "requested": "1001"}
    fresh = await limiter.reserve("k", limits, 1000)
    assert (fresh.remaining_requests, fresh.remaining_tokens) == (9, 0)


@pytest.mark.asyncio
async def test_settling_below_the_reservation_frees_tokens(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(tpm=1000)
    big = await limiter.reserve("k", limits, 600)
    await refused(limiter.reserve("k", limits, 500))
    await limiter.settle(big, 100)
    assert (await limiter.reserve("k", limits, 500)).remaining_tokens == 400


@pytest.mark.asyncio
async def test_an_overrun_is_charged_and_blocks_until_it_drains(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(tpm=1000)
    reservation = await limiter.reserve("k", limits, 100)
    await limiter.settle(reservation, 1100)
    error = await refused(limiter.reserve("k", limits, 1))
    assert error.metadata["limit"] == "tokens"
    assert error.retry_after_s is not None
    limiters.clock.advance(error.retry_after_s)
    await limiter.reserve("k", limits, 1000)


@pytest.mark.asyncio
async def test_settle_counts_once_per_reservation(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(tpm=1000)
    first = await limiter.reserve("k", limits, 500)
    await limiter.reserve("k", limits, 500)
    await limiter.settle(first, 0)
    await limiter.settle(first, 0)  # must not hand back the other reservation's tokens
    assert (await limiter.reserve("k", limits, 500)).remaining_tokens == 0
    await refused(limiter.reserve("k", limits, 1))


@pytest.mark.asyncio
async def test_settling_after_the_window_leaves_the_next_window_alone(limiters: Limiters) -> None:
    limiter = limiters.make()
    limits = RateLimits(tpm=1000)
    old_a = await limiter.reserve("k", limits, 500)
    old_b = await limiter.reserve("k", limits, 500)
    limiters.clock.advance(61.0)
    await limiter.reserve("k", limits, 500)
    # The old window is gone: returning its tokens frees nothing in this one...
    await limiter.settle(old_a, 0)
    await refused(limiter.reserve("k", limits, 501))
    # ...and an old turn's overrun is not charged to it either.
    await limiter.settle(old_b, 5000)
    assert (await limiter.reserve("k", limits, 500)).remaining_tokens == 0


@pytest.mark.asyncio
async def test_windows_roll_over(limiters: Limiters) -> None:
    limiter = limiters.make(window_s=1.0, buckets=10)
    limits = RateLimits(rpm=2, tpm=100)
    await limiter.reserve("k", limits, 50)
    limiters.clock.advance(0.5)
    await limiter.reserve("k", limits, 50)
    limiters.clock.advance(0.45)
    await refused(limiter.reserve("k", limits, 1))
    # The first request's sub-bucket leaves first, so one request fits again...
    limiters.clock.advance(0.2)
    assert (await limiter.reserve("k", limits, 50)).remaining_requests == 0
    await refused(limiter.reserve("k", limits, 1))
    # ...and after a whole window (plus a sub-bucket) of quiet, all of it.
    limiters.clock.advance(1.1)
    fresh = await limiter.reserve("k", limits, 100)
    assert (fresh.remaining_requests, fresh.remaining_tokens) == (1, 0)


@pytest.mark.asyncio
async def test_no_window_of_window_s_ever_holds_more_than_the_limit(limiters: Limiters) -> None:
    limiter = limiters.make(window_s=1.0, buckets=10)
    limits = RateLimits(rpm=1)
    limiters.clock.advance(0.05)  # mid sub-bucket
    await limiter.reserve("k", limits, 0)
    # Ten sub-buckets later, but still within one second of the first request.
    limiters.clock.advance(0.95)
    await refused(limiter.reserve("k", limits, 0))
    limiters.clock.advance(0.049)
    await refused(limiter.reserve("k", limits, 0))
    limiters.clock.advance(0.051)
    await limiter.reserve("k", limits, 0)


@pytest.mark.asyncio
async def test_keys_are_limited_separately(limiters: Limiters) -> None:
    limiter = limiters.make()
    await limiter.reserve("a", RateLimits(rpm=1), 1)
    await refused(limiter.reserve("a", RateLimits(rpm=1), 1))
    assert (await limiter.reserve("b", RateLimits(rpm=1), 1)).remaining_requests == 0


@pytest.mark.asyncio
async def test_unlimited_keys_are_always_admitted(limiters: Limiters) -> None:
    limiter = limiters.make()
    for _ in range(5):
        reservation = await limiter.reserve("k", RateLimits(), 10**9)
        assert (reservation.limit_requests, reservation.limit_tokens) == (0, 0)
        await limiter.settle(reservation, 10**10)


@pytest.mark.asyncio
async def test_replicas_share_one_count(limiters: Limiters) -> None:
    one, two = limiters.make(), limiters.make()
    limits = RateLimits(rpm=4, tpm=1000)
    await one.reserve("k", limits, 300)
    await two.reserve("k", limits, 300)
    third = await one.reserve("k", limits, 300)
    assert (third.remaining_requests, third.remaining_tokens) == (1, 100)
    await refused(two.reserve("k", limits, 200))
    await two.settle(third, 100)  # settled on another replica than it was reserved on
    assert (await two.reserve("k", limits, 300)).remaining_tokens == 0


# ------------------------------------------------------------ Redis only


@pytest.mark.asyncio
async def test_two_replicas_hammered_concurrently_admit_exactly_the_rpm(
    redis_clients: Callable[[], Redis], redis_prefix: str
) -> None:
    replicas = [RedisRateLimiter(redis_clients(), redis_prefix) for _ in range(2)]
    limits = RateLimits(rpm=50)

    async def one(i: int) -> ResourceExhausted | None:
        try:
            await replicas[i % 2].reserve("hammered", limits, 1)
        except ResourceExhausted as error:
            return error
        return None

    outcomes = await asyncio.gather(*(one(i) for i in range(200)))
    errors = [e for e in outcomes if e is not None]
    # Exact, since each decision is one atomic script: within one request of the limit a fortiori.
    assert len(outcomes) - len(errors) == 50
    assert all(e.reason == "RATE_LIMITED" and e.metadata["limit"] == "requests" for e in errors)
    assert all(e.retry_after_s is not None and e.retry_after_s > 0 for e in errors)


@pytest.mark.asyncio
async def test_tpm_across_replicas_frees_room_when_settled_lower(
    redis_clients: Callable[[], Redis], redis_prefix: str
) -> None:
    replicas = [RedisRateLimiter(redis_clients(), redis_prefix) for _ in range(2)]
    limits = RateLimits(tpm=1000)

    async def burst() -> list[Reservation]:
        async def one(i: int) -> Reservation | None:
            try:
                return await replicas[i % 2].reserve("tokens", limits, 100)
            except ResourceExhausted:
                return None

        return [r for r in await asyncio.gather(*(one(i) for i in range(20))) if r is not None]

    admitted = await burst()
    assert len(admitted) == 10
    # Each turn used 10 of its 100 reserved tokens: 900 come back.
    await asyncio.gather(*(replicas[(i + 1) % 2].settle(r, 10) for i, r in enumerate(admitted)))
    assert len(await burst()) == 9


@pytest.mark.asyncio
async def test_windows_roll_over_on_redis_time(redis_clients: Callable[[], Redis], redis_prefix: str) -> None:
    limiter = RedisRateLimiter(redis_clients(), redis_prefix, window_s=1.0, buckets=10)
    limits = RateLimits(rpm=5)
    for _ in range(5):
        await limiter.reserve("k", limits, 1)
    error = await refused(limiter.reserve("k", limits, 1))
    assert error.retry_after_s is not None
    assert 0 < error.retry_after_s <= 1.1
    await asyncio.sleep(error.retry_after_s + 0.05)
    await limiter.reserve("k", limits, 1)


@pytest.mark.asyncio
async def test_redis_keys_expire(redis_clients: Callable[[], Redis], redis_prefix: str) -> None:
    client = redis_clients()
    limiter = RedisRateLimiter(client, redis_prefix, window_s=1.0, buckets=10)
    reservation = await limiter.reserve("k", RateLimits(rpm=5, tpm=100), 10)
    await limiter.settle(reservation, 20)
    ttl_ms = await client.pttl(redis_prefix + "k")
    assert 0 < ttl_ms <= 1200


# ------------------------------------------------------------ properties

WINDOW_US = 1 * US
BUCKET_US = WINDOW_US // 10


@dataclass(frozen=True)
class Op:
    kind: str
    n: int
    ratio: float = 0.0


ops = st.lists(
    st.one_of(
        st.builds(Op, st.just("reserve"), st.integers(0, 300)),
        st.builds(Op, st.just("settle"), st.integers(0, 10**6), st.floats(0, 2)),
        st.builds(Op, st.just("advance"), st.integers(0, 700)),
    ),
    min_size=10,
    max_size=80,
)


@dataclass
class Admitted:
    at_us: int
    reservation: Reservation
    tokens: int


@settings(max_examples=200)
@given(rpm=st.integers(0, 6), tpm=st.sampled_from([0, 100, 400, 1000]), script=ops)
def test_local_limiter_never_admits_more_than_the_limit_in_any_window(
    rpm: int, tpm: int, script: list[Op]
) -> None:
    asyncio.run(_run_limiter_script(RateLimits(rpm=rpm, tpm=tpm), script))


async def _run_limiter_script(limits: RateLimits, script: list[Op]) -> None:
    now_ms = 1_000_000
    limiter = LocalRateLimiter(window_s=1.0, buckets=10, clock=lambda: now_ms / 1000)
    admitted: list[Admitted] = []

    def usage_since(start_us: int) -> tuple[int, int]:
        """Requests and tokens (actual once settled) admitted after ``start_us``."""
        recent = [a for a in admitted if a.at_us > start_us]
        return len(recent), sum(a.tokens for a in recent)

    for op in script:
        now_us = now_ms * 1000
        if op.kind == "advance":
            now_ms += op.n
        elif op.kind == "settle" and admitted:
            entry = admitted[op.n % len(admitted)]
            actual = int(entry.reservation.reserved_tokens * op.ratio)
            first = not entry.reservation.settled
            await limiter.settle(entry.reservation, actual)
            if first:
                entry.tokens = actual
        elif op.kind == "reserve":
            tokens = op.n
            outcome = await attempt(limiter.reserve("k", limits, tokens))
            if isinstance(outcome, Reservation):
                admitted.append(Admitted(now_us, outcome, tokens))
                # Never over: the last window, this request included, is within both limits.
                requests, used = usage_since(now_us - WINDOW_US)
                assert not limits.rpm or requests <= limits.rpm
                assert not limits.tpm or used <= limits.tpm
            elif limits.tpm and tokens > limits.tpm:
                assert outcome.retry_after_s is None
            else:
                assert outcome.retry_after_s is not None
                assert outcome.retry_after_s > 0
                # A refusal is justified by the usage of the last window plus one sub-bucket.
                requests, used = usage_since(now_us - WINDOW_US - BUCKET_US)
                assert (limits.rpm and requests + 1 > limits.rpm) or (
                    limits.tpm and used + tokens > limits.tpm
                )
