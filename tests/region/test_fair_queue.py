"""Admission control: slots, weighted fairness across tiers, shedding and
cancellation. Service is counted in slot releases, never in wall-clock time."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.core.errors import ResourceExhausted
from llmmesh.region.admission.fair_queue import (
    DEFAULT_TIER_WEIGHTS,
    FairQueue,
    Ticket,
    engine_priority,
    tier_name,
)
from llmmesh.v1 import common_pb2


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def run_ready() -> None:
    """Let every task that can run, run until it blocks."""
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass
class Crowd:
    """Waiter tasks on one queue, and the order in which they got slots."""

    queue: FairQueue
    granted: list[str] = field(default_factory=list)
    tickets: dict[str, Ticket] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def arrive(self, name: str, tier: str, deadline_s: float | None = None) -> None:
        async def wait() -> None:
            self.tickets[name] = await self.queue.acquire(tier, deadline_s)
            self.granted.append(name)

        self.tasks[name] = asyncio.create_task(wait(), name=name)
        await run_ready()

    async def release(self, name: str) -> None:
        self.queue.release(self.tickets.pop(name))
        await run_ready()

    async def release_oldest(self) -> str:
        """Release the slot granted longest ago; the name of the turn that took it over, if any."""
        before = len(self.granted)
        await self.release(next(iter(self.tickets)))
        return self.granted[before] if len(self.granted) > before else ""

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def overloaded(queue: FairQueue, tier: str, deadline_s: float | None = None) -> ResourceExhausted:
    with pytest.raises(ResourceExhausted) as info:
        await queue.acquire(tier, deadline_s)
    assert info.value.reason == "OVERLOADED"
    assert info.value.retry_after_s is not None
    assert info.value.retry_after_s > 0
    return info.value


# ------------------------------------------------------------ slots and order


@pytest.mark.asyncio
async def test_capacity_bounds_running_turns_and_each_tier_is_fifo() -> None:
    crowd = Crowd(FairQueue(capacity=2, max_waiting=10))
    for i in range(5):
        await crowd.arrive(f"f{i}", "free")
    assert crowd.granted == ["f0", "f1"]
    assert crowd.queue.stats().running == 2
    assert crowd.queue.stats().waiting["free"] == 3
    for _ in range(3):
        await crowd.release_oldest()
        assert crowd.queue.stats().running == 2
    assert crowd.granted == ["f0", "f1", "f2", "f3", "f4"]
    await crowd.close()


@pytest.mark.asyncio
async def test_slots_are_shared_by_weight_while_tiers_are_backlogged() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=100))
    await crowd.arrive("running", "free")
    for i in range(20):
        await crowd.arrive(f"free{i}", "free")
    for i in range(20):
        await crowd.arrive(f"pro{i}", "pro")
    served = [await crowd.release_oldest() for _ in range(20)]
    pro = sum(name.startswith("pro") for name in served)
    # Weights 4:1 give pro 16 of 20 slots, give or take one each way.
    assert 15 <= pro <= 17
    await crowd.close()


@pytest.mark.asyncio
async def test_a_free_flood_delays_a_pro_request_by_at_most_one_release() -> None:
    crowd = Crowd(FairQueue(capacity=2, max_waiting=1000))
    for i in range(2 + 200):
        await crowd.arrive(f"free{i}", "free")
    for _ in range(5):  # the flood has been flowing for a while
        await crowd.release_oldest()
    await crowd.arrive("pro", "pro")
    releases = 0
    while "pro" not in crowd.granted:
        await crowd.release_oldest()
        releases += 1
    assert releases == 1
    await crowd.close()


@pytest.mark.asyncio
async def test_a_tier_that_was_idle_banks_no_credit() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=100))
    await crowd.arrive("running", "pro")
    for i in range(40):
        await crowd.arrive(f"pro{i}", "pro")
    # Pro alone got 30 slots while free was idle; then free turns arrive.
    first = [await crowd.release_oldest() for _ in range(30)]
    assert all(name.startswith("pro") for name in first)
    for i in range(10):
        await crowd.arrive(f"free{i}", "free")
    served = [await crowd.release_oldest() for _ in range(10)]
    # No catching up for free's idle time, no penalty for pro's past service: 4:1 from here.
    assert 7 <= sum(name.startswith("pro") for name in served) <= 9
    await crowd.close()


@pytest.mark.asyncio
async def test_raising_capacity_admits_waiters() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=10))
    for i in range(4):
        await crowd.arrive(f"f{i}", "free")
    crowd.queue.set_capacity(3)
    await run_ready()
    assert crowd.granted == ["f0", "f1", "f2"]
    assert crowd.queue.stats().running == 3
    await crowd.close()


@pytest.mark.asyncio
async def test_an_error_inside_admit_frees_the_slot() -> None:
    queue = FairQueue(capacity=1, max_waiting=10)

    async def failing_turn() -> None:
        async with queue.admit("pro"):
            assert queue.stats().running == 1
            raise RuntimeError("turn failed")

    with pytest.raises(RuntimeError):
        await failing_turn()
    assert queue.stats().running == 0
    async with queue.admit("pro") as ticket:
        assert ticket.tier == "pro"
        queue.release(ticket)  # a release too many is harmless
    assert queue.stats().running == 0


# ------------------------------------------------------------ shedding


@pytest.mark.asyncio
async def test_a_full_queue_sheds_with_retry_info() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=3))
    for i in range(4):
        await crowd.arrive(f"f{i}", "free")
    error = await overloaded(crowd.queue, "free")
    assert error.metadata == {"tier": "free", "cause": "queue_full"}
    stats = crowd.queue.stats()
    assert (stats.running, stats.total_waiting, stats.shed["free"]) == (1, 3, 1)
    await crowd.close()


@pytest.mark.asyncio
async def test_a_higher_tier_pushes_the_last_free_waiter_out_of_a_full_queue() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=3))
    for i in range(4):
        await crowd.arrive(f"f{i}", "free")
    await crowd.arrive("pro", "pro")
    with pytest.raises(ResourceExhausted) as info:
        await crowd.tasks["f3"]
    assert info.value.reason == "OVERLOADED"
    assert info.value.metadata["cause"] == "pushed_out"
    assert info.value.retry_after_s is not None
    assert info.value.retry_after_s > 0
    assert crowd.queue.stats().shed == {"free": 1, "pro": 0, "enterprise": 0}
    assert await crowd.release_oldest() == "pro"
    await crowd.close()


@pytest.mark.asyncio
async def test_an_arrival_that_would_miss_its_deadline_is_shed_at_once() -> None:
    clock = FakeClock()
    crowd = Crowd(FairQueue(capacity=1, max_waiting=100, clock=clock))
    await crowd.arrive("first", "free")
    # Without any service history nothing is shed for its deadline.
    assert crowd.queue.expected_wait_s("free") is None
    await crowd.arrive("second", "free", deadline_s=0.001)
    assert crowd.queue.stats().waiting["free"] == 1
    for i in range(3):  # each turn holds its slot for 2 s
        await crowd.arrive(f"warmup{i}", "free")
        clock.now += 2.0
        await crowd.release_oldest()
    assert crowd.queue.stats().mean_hold_s == pytest.approx(2.0)
    await crowd.arrive("w0", "free")

    # A free arrival is served after the two free waiters, on one slot releasing every 2 s: 6 s.
    assert crowd.queue.expected_wait_s("free") == pytest.approx(6.0)
    error = await overloaded(crowd.queue, "free", deadline_s=5.0)
    assert error.metadata["cause"] == "deadline"
    assert error.retry_after_s == pytest.approx(6.0)
    # A pro arrival is next in line whatever free has queued.
    assert crowd.queue.expected_wait_s("pro") == pytest.approx(2.0)
    await crowd.arrive("pro", "pro", deadline_s=5.0)
    await crowd.arrive("patient", "free", deadline_s=60.0)
    assert crowd.queue.stats().waiting == {"free": 3, "pro": 1, "enterprise": 0}
    assert crowd.queue.stats().shed["free"] == 1
    await crowd.close()


# ------------------------------------------------------------ cancellation


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=10))
    for name in ("a", "b", "c"):
        await crowd.arrive(name, "free")
    crowd.tasks["b"].cancel()
    await run_ready()
    assert crowd.tasks["b"].cancelled()
    assert crowd.queue.stats().waiting["free"] == 1
    assert await crowd.release_oldest() == "c"
    assert crowd.queue.stats().running == 1
    await crowd.close()


@pytest.mark.asyncio
async def test_a_slot_granted_to_a_waiter_cancelled_before_it_ran_passes_on() -> None:
    crowd = Crowd(FairQueue(capacity=1, max_waiting=10))
    for name in ("a", "b", "c"):
        await crowd.arrive(name, "free")
    crowd.queue.release(crowd.tickets.pop("a"))  # hands the slot to b...
    crowd.tasks["b"].cancel()  # ...which is cancelled before it could run
    await run_ready()
    assert crowd.tasks["b"].cancelled()
    assert crowd.granted == ["a", "c"]
    assert crowd.queue.stats().running == 1
    await crowd.close()


def test_engine_priority_runs_higher_tiers_first() -> None:
    assert [engine_priority(t) for t in ("enterprise", "pro", "free", "trial")] == [0, 1, 2, 3]
    assert engine_priority(common_pb2.TIER_ENTERPRISE) == 0
    assert engine_priority(common_pb2.TIER_FREE) == 2
    assert engine_priority(common_pb2.TIER_UNSPECIFIED) == 2  # served as free, as the gateway always did
    assert tier_name(common_pb2.TIER_PRO) == "pro"


# ------------------------------------------------------------ properties

TIERS = sorted(DEFAULT_TIER_WEIGHTS)

step = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(TIERS)),
    st.tuples(st.just("release"), st.just("")),
    st.tuples(st.just("cancel"), st.sampled_from(TIERS)),
)


@settings(max_examples=150)
@given(capacity=st.integers(1, 3), steps=st.lists(step, min_size=1, max_size=80))
def test_fair_queue_respects_capacity_and_weights_and_starves_no_one(
    capacity: int, steps: list[tuple[str, str]]
) -> None:
    asyncio.run(_run_queue_script(capacity, steps))


async def _run_queue_script(capacity: int, steps: list[tuple[str, str]]) -> None:
    weights = DEFAULT_TIER_WEIGHTS
    crowd = Crowd(FairQueue(capacity=capacity, weights=weights, max_waiting=1000))
    names = itertools.count()
    tier_of: dict[str, str] = {}
    waiting: dict[str, list[str]] = {t: [] for t in TIERS}  # FIFO per tier, as the test saw it
    served = dict.fromkeys(TIERS, 0)
    pair_start: dict[tuple[str, str], tuple[int, int]] = {}
    grants_to_others: dict[str, int] = {}  # head of its tier -> grants to other tiers since

    def head_bound(tier: str) -> int:
        """SCFQ: a head is served within sum(floor(w_i / w) + 1) grants to other tiers."""
        return sum(int(weights[o] // weights[tier]) + 1 for o in TIERS if o != tier)

    def note_heads() -> None:
        for queue in waiting.values():
            if queue:
                grants_to_others.setdefault(queue[0], 0)

    def note_grants(before: int) -> None:
        for name in crowd.granted[before:]:
            tier = tier_of[name]
            if name in waiting[tier]:
                assert waiting[tier][0] == name, "FIFO within a tier"
                waiting[tier].pop(0)
            grants_to_others.pop(name, None)
            for other, count in grants_to_others.items():
                if tier_of[other] != tier:
                    grants_to_others[other] = count + 1
                    assert count + 1 <= head_bound(tier_of[other]), f"{other} starved"
            served[tier] += 1

    def check_pairs() -> None:
        """While two tiers stay backlogged, their weighted service stays within 1/w_i + 1/w_j."""
        for i, j in itertools.combinations(TIERS, 2):
            if (i, j) in pair_start:
                si, sj = pair_start[i, j]
                gap = (served[i] - si) / weights[i] - (served[j] - sj) / weights[j]
                assert abs(gap) <= 1 / weights[i] + 1 / weights[j] + 1e-9
            if waiting[i] and waiting[j]:
                pair_start.setdefault((i, j), (served[i], served[j]))
            else:
                pair_start.pop((i, j), None)

    for kind, arg in steps:
        before = len(crowd.granted)
        if kind == "arrive":
            name = f"{arg}{next(names)}"
            tier_of[name] = arg
            await crowd.arrive(name, arg)
            if name not in crowd.granted:
                waiting[arg].append(name)
        elif kind == "release" and crowd.tickets:
            await crowd.release_oldest()
        elif kind == "cancel" and waiting[arg]:
            name = waiting[arg].pop(len(waiting[arg]) // 2)
            grants_to_others.pop(name, None)
            crowd.tasks[name].cancel()
            await run_ready()
            assert crowd.tasks[name].cancelled()
        note_grants(before)
        check_pairs()
        note_heads()
        stats = crowd.queue.stats()
        assert len(crowd.tickets) == stats.running <= capacity
        assert stats.waiting == {t: len(q) for t, q in waiting.items()}

    # Releasing keeps serving until everyone who did not leave got a slot.
    while crowd.tickets:
        before = len(crowd.granted)
        await crowd.release_oldest()
        note_grants(before)
        check_pairs()
        note_heads()
    assert not any(waiting.values())
    assert crowd.queue.stats().running == 0
    await crowd.close()
