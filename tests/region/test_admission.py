"""Admission of a turn: monthly quota, rate limits with a fallback when Redis
is gone, the fair queue's headroom for paying tiers, and the hold-back of
filtered output. Real zone store (SQLite), fake billing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from llmmesh.core.errors import Reason, ResourceExhausted
from llmmesh.region.admission.control import Admission
from llmmesh.region.admission.fair_queue import FairQueue
from llmmesh.region.admission.quota import QuotaLedger, month_start
from llmmesh.region.admission.ratelimit import LocalRateLimiter
from llmmesh.region.admission.ratelimit_redis import RedisRateLimiter
from llmmesh.region.policy_cache import Caller
from llmmesh.region.safety import RulesBackend, StreamingOutputFilter
from llmmesh.region.turn.filtered_output import FilteredOutput
from llmmesh.region.zone_store import UsageKey, ZoneStore
from llmmesh.region.zone_store.rows import AssistantMessage
from llmmesh.v1 import billing_service_pb2, common_pb2, policy_service_pb2

pytestmark = pytest.mark.asyncio

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class Unreachable(grpc.aio.AioRpcError):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


class FakeBilling:
    """BillingService.GetUsage with a settable total, or down."""

    def __init__(self, tokens: int = 0) -> None:
        self.tokens = tokens
        self.down = False
        self.calls = 0

    async def GetUsage(
        self, request: billing_service_pb2.GetUsageRequest, **call_options: object
    ) -> billing_service_pb2.GetUsageResponse:
        self.calls += 1
        if self.down:
            raise Unreachable()
        return billing_service_pb2.GetUsageResponse(
            period=request.period, input_tokens=self.tokens // 2, output_tokens=self.tokens - self.tokens // 2
        )


class Clocks:
    def __init__(self) -> None:
        self.mono = 0.0
        self.wall = NOW

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall


def caller(
    quota: int = 0, rpm: int = 0, tpm: int = 0, tier: common_pb2.Tier.ValueType = common_pb2.TIER_FREE
) -> Caller:
    tenant = policy_service_pb2.Tenant(
        id="ten_a", tier=tier, rpm_limit=rpm, tpm_limit=tpm, monthly_token_quota=quota
    )
    return Caller(tenant, "key_a")


@pytest_asyncio.fixture
async def store() -> AsyncIterator[ZoneStore]:
    zone_store = await ZoneStore.open("sqlite://", "us", "us-east")
    yield zone_store
    zone_store.dispose()


async def record(store: ZoneStore, request_id: str, tokens: int, tenant: str = "ten_a") -> None:
    await store.record_turn(
        tenant, None, request_id, None, AssistantMessage("", "m", "FINISH_REASON_STOP"), b"", tokens=tokens
    )


def ledger(billing: FakeBilling, store: ZoneStore, clocks: Clocks) -> QuotaLedger:
    return QuotaLedger(
        billing,  # type: ignore[arg-type]
        store,
        refresh_s=30.0,
        clock=clocks.monotonic,
        wall_clock=clocks.now,
    )


async def test_month_to_date_counts_billing_unshipped_rows_and_running_turns(store: ZoneStore) -> None:
    clocks = Clocks()
    billing = FakeBilling(tokens=600)
    quota = ledger(billing, store, clocks)
    await record(store, "r1", 100)
    await record(store, "r2", 50, tenant="ten_b")  # another tenant's
    assert await quota.used("ten_a") == 700
    hold = await quota.hold(caller(quota=1000), 250)
    assert await quota.used("ten_a") == 950
    with pytest.raises(ResourceExhausted) as refused:
        await quota.hold(caller(quota=900), 10)
    assert refused.value.reason == Reason.QUOTA_EXCEEDED
    assert refused.value.metadata == {"quota": "900", "used": "950", "period": "2026-11"}
    quota.release(hold)
    quota.release(hold)  # once only
    assert await quota.used("ten_a") == 700


async def test_rows_shipped_before_the_billing_read_are_not_counted_twice(store: ZoneStore) -> None:
    clocks = Clocks()
    billing = FakeBilling(tokens=100)
    store_clock = [NOW - timedelta(minutes=5)]
    store._clock = lambda: store_clock[0]  # rows recorded and shipped five minutes ago
    await record(store, "old", 100)
    await store.mark_shipped([UsageKey("ten_a", "old")])
    quota = ledger(billing, store, clocks)
    assert await quota.used("ten_a") == 100  # billing's total holds it
    store_clock[0] = NOW + timedelta(seconds=1)
    await record(store, "new", 40)
    await store.mark_shipped([UsageKey("ten_a", "new")])  # shipped after billing was read: counted here
    assert await quota.used("ten_a") == 140
    clocks.mono += 31
    clocks.wall = NOW + timedelta(seconds=2)
    billing.tokens = 140
    assert await quota.used("ten_a") == 140
    assert billing.calls == 2


async def test_billing_down_keeps_the_last_total_and_asks_once_per_refresh(store: ZoneStore) -> None:
    clocks = Clocks()
    billing = FakeBilling(tokens=500)
    quota = ledger(billing, store, clocks)
    assert await quota.used("ten_a") == 500
    billing.down = True
    clocks.mono += 31
    await record(store, "r1", 20)
    for _ in range(5):
        assert await quota.used("ten_a") == 520
    assert billing.calls == 2


async def test_with_billing_never_reached_every_row_of_the_month_counts(store: ZoneStore) -> None:
    clocks = Clocks()
    billing = FakeBilling()
    billing.down = True
    store._clock = lambda: month_start(NOW) - timedelta(seconds=1)
    await record(store, "last-month", 1000)
    store._clock = lambda: NOW
    await record(store, "r1", 30)
    await store.mark_shipped([UsageKey("ten_a", "r1")])
    assert await ledger(billing, store, clocks).used("ten_a") == 30


async def test_admission_gives_everything_back_when_the_queue_sheds(store: ZoneStore) -> None:
    clocks = Clocks()
    limiter = LocalRateLimiter()
    quota = ledger(FakeBilling(), store, clocks)
    queue = FairQueue(1, max_waiting=0)
    admission = Admission(limiter, quota, queue)
    who = caller(quota=10_000, rpm=10, tpm=1000)
    first = await admission.admit(who, 400, None)
    assert first.reservation.remaining_tokens == 600
    with pytest.raises(ResourceExhausted) as shed:
        await admission.admit(who, 400, None)
    assert shed.value.reason == Reason.OVERLOADED and shed.value.retry_after_s
    assert await quota.used("ten_a") == 400  # only the first turn's hold
    first.release_slot()
    await first.settle(100)
    first.release_quota()
    again = await admission.admit(who, 400, None)
    # 100 settled + 0 for the shed turn + 400 now.
    assert again.reservation.remaining_tokens == 500
    assert again.reservation.remaining_requests == 7


async def test_rate_limits_refuse_with_retry_info(store: ZoneStore) -> None:
    admission = Admission(LocalRateLimiter(), ledger(FakeBilling(), store, Clocks()), FairQueue(10))
    who = caller(rpm=2)
    for _ in range(2):
        await admission.admit(who, 1, None)
    with pytest.raises(ResourceExhausted) as refused:
        await admission.admit(who, 1, None)
    assert refused.value.reason == Reason.RATE_LIMITED
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0


async def test_an_unreachable_redis_falls_back_to_limits_in_this_process(store: ZoneStore) -> None:
    client = Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    try:
        shared = RedisRateLimiter(client, prefix="llmmesh:test:")
        admission = Admission(shared, ledger(FakeBilling(), store, Clocks()), FairQueue(10))
        who = caller(rpm=1)
        admitted = await admission.admit(who, 5, None)
        assert admitted.limiter is not shared
        await admitted.settle(5)
        with pytest.raises(ResourceExhausted) as refused:
            await admission.admit(who, 5, None)
        assert refused.value.reason == Reason.RATE_LIMITED
    finally:
        await client.aclose()


async def test_free_turns_leave_the_reserve_to_paying_tiers() -> None:
    queue = FairQueue(4, reserve=1)
    free = [await queue.acquire("free") for _ in range(3)]
    waiting = asyncio.create_task(queue.acquire("free"))
    await asyncio.sleep(0)
    assert not waiting.done()
    pro = await asyncio.wait_for(queue.acquire("pro"), 1.0)  # at once, ahead of the waiting free turn
    assert queue.stats().running == 4
    queue.release(pro)
    await asyncio.sleep(0)
    assert not waiting.done()  # the freed slot is the reserve
    queue.release(free[0])
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert ticket.tier == "free"


async def test_filtered_output_delivers_whole_deltas_once_their_text_is_checked() -> None:
    rules = RulesBackend(deny_terms={"violence": ("stab him",)})
    output = FilteredOutput(StreamingOutputFilter([rules], window_chars=32, overlap_chars=12))
    delivered: list[tuple[str, tuple[int, ...]]] = []
    words = [
        "the",
        "mesh",
        "streams",
        "tokens",
        "to",
        "every",
        "region",
        "of",
        "the",
        "zone",
        "and",
        "keeps",
        "them",
    ]
    for n, word in enumerate(words):
        release = await output.feed(word + " ", (n,))
        if release:
            delivered.append((release.text, release.token_ids))
    tail = await output.finish()
    delivered.append((tail.text, tail.token_ids))
    assert "".join(text for text, _ in delivered) == " ".join(words) + " "
    assert [i for _, ids in delivered for i in ids] == list(range(len(words)))
    assert len(delivered) > 2  # released as checked, not only at the end


async def test_filtered_output_withholds_a_phrase_split_across_deltas() -> None:
    rules = RulesBackend(deny_terms={"violence": ("stab him",)})
    output = FilteredOutput(StreamingOutputFilter([rules], window_chars=32, overlap_chars=12))
    released = []
    for n, piece in enumerate(["I will ", "st", "ab", " h", "im now"]):
        release = await output.feed(piece, (n,))
        released.append(release.text)
    assert output.stopped is not None and "violence" in output.stopped.categories
    assert "st" not in "".join(released)
    assert output.held_tokens >= 4
    assert not await output.finish()


async def test_work_no_chat_pod_does_is_admitted_without_a_chat_slot(store: ZoneStore) -> None:
    # Capacity 0: every chat pod is down. Embeddings and moderation must not
    # wait on the chat pods' slots, yet stay rate limited.
    admission = Admission(LocalRateLimiter(), ledger(FakeBilling(), store, Clocks()), FairQueue(0))
    who = caller(rpm=1)
    admitted = await asyncio.wait_for(admission.admit(who, 5, None, slot=False), timeout=5)
    assert admitted.ticket is None and admission.queue.stats().capacity == 0
    admitted.release_slot()
    await admitted.settle(5)
    admitted.release_quota()
    with pytest.raises(ResourceExhausted) as refused:
        await admission.admit(who, 5, None, slot=False)
    assert refused.value.reason == Reason.RATE_LIMITED
