"""Admission control for chat turns: at most ``capacity`` turns run at once,
and the rest wait in a bounded queue that is weighted-fair across tenant tiers.

Scheduling is self-clocked fair queueing (SCFQ, Golestani 1994) with unit
cost per turn. Within a tier, waiters are served FIFO. When a waiter reaches
the head of its tier it is tagged with start ``S = max(V, F_last)`` and
virtual finish ``F = S + 1 / weight``. ``F_last`` is the finish tag of the
tier's last served turn, and ``V`` (virtual time) is the finish tag of the
last turn served from any tier. A freed slot goes to the head with the
smallest finish tag; on a tie, the one that arrived first wins.

While two tiers both have waiters, their weighted service ``n / weight``
never differs by more than ``1/w_i + 1/w_j``. Once a waiter is the head of
its tier it is served within ``sum(floor(w_i / w_own) + 1)`` grants to other
tiers, so no tier starves. An idle tier banks no credit, because its next
head starts at ``V``. So a flood of free turns delays a newly arrived pro
turn by at most one slot release.

Headroom for paying tiers: with ``reserve`` > 0, the tiers of the smallest
weight (free) may fill only ``capacity - reserve`` slots. A flood of free
turns then leaves slots open, and a pro turn arriving into it is admitted at
once; the engine's priority scheduling (``engine_priority``) runs it in the
next step, preempting a free generation if the batch is full. Without the
reserve it would wait for one slot release.

The queue is bounded:

- At most ``max_waiting`` turns wait. When it is full, an arrival that would
  be served before the last waiter in line pushes that waiter out. Otherwise
  the arrival is shed.
- An arrival whose expected wait exceeds its ``deadline_s`` is shed at once,
  before its client would time out.

The expected wait counts the waiters that would be served first (by the same
tags) and divides by the service rate ``capacity / mean slot hold`` over the
last releases. The rate comes from hold times, not from the spacing of
releases. Release spacing under light load shows the arrival rate, not what
the slots can do, and would shed too eagerly just as load rises. Shedding
raises ResourceExhausted(OVERLOADED) with the expected wait as
``retry_after_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmmesh.core.errors import Reason, ResourceExhausted
from llmmesh.v1 import common_pb2

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = MappingProxyType({"free": 1.0, "pro": 4.0, "enterprise": 8.0})

# vLLM schedules lower priority values first.
# An unset tier is served as free, as the policy treats it.
ENGINE_PRIORITY: Mapping[str, int] = MappingProxyType(
    {"enterprise": 0, "pro": 1, "free": 2, "unspecified": 2}
)
UNKNOWN_TIER_PRIORITY = 3

# Slack for comparing virtual times, which are sums of 1/weight.
_EPS = 1e-9
_MIN_RETRY_AFTER_S = 0.01


def tier_name(tier: common_pb2.Tier.ValueType) -> str:
    """The queue tier of a tenant tier enum: "free", "pro", "enterprise",
    "unspecified", or "unknown" for a value this build does not know."""
    try:
        return common_pb2.Tier.Name(tier).removeprefix("TIER_").lower()
    except ValueError:
        return "unknown"


def engine_priority(tier: str | common_pb2.Tier.ValueType) -> int:
    """The vLLM request priority of a tier (a name or the tenant tier enum):
    enterprise 0, pro 1, free and unset 2; a tier this build does not know runs last."""
    name = tier if isinstance(tier, str) else tier_name(tier)
    return ENGINE_PRIORITY.get(name, UNKNOWN_TIER_PRIORITY)


@dataclass(eq=False)
class Ticket:
    """One granted slot; give it back with :meth:`FairQueue.release`."""

    tier: str
    granted_at: float
    released: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class QueueStats:
    """A snapshot for load reports and heartbeats."""

    capacity: int
    running: int
    waiting: Mapping[str, int]
    shed: Mapping[str, int]
    admitted: Mapping[str, int]
    # Mean seconds a slot was held over the recent releases; None before the first.
    mean_hold_s: float | None

    @property
    def total_waiting(self) -> int:
        return sum(self.waiting.values())

    @property
    def total_shed(self) -> int:
        return sum(self.shed.values())


class _Tier:
    def __init__(self, name: str, weight: float) -> None:
        self.name = name
        self.weight = weight
        self.queue: deque[_Waiter] = deque()
        self.head_finish = 0.0
        self.last_finish = 0.0
        self.shed = 0
        self.admitted = 0

    def tail_finish(self) -> float:
        return self.head_finish + (len(self.queue) - 1) / self.weight


@dataclass(eq=False)
class _Waiter:
    tier: _Tier
    seq: int
    future: asyncio.Future[Ticket]


class FairQueue:
    """Bounded, weighted-fair admission of turns to ``capacity`` slots.

    ``weights`` maps tier names to their share; a tier not in it gets the
    smallest configured weight. ``clock`` (seconds) times slot holds, for the
    expected wait.
    """

    def __init__(
        self,
        capacity: int,
        weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
        max_waiting: int = 1000,
        *,
        clock: Callable[[], float] = time.monotonic,
        hold_samples: int = 64,
        default_retry_after_s: float = 1.0,
        reserve: int = 0,
    ) -> None:
        if capacity < 0 or max_waiting < 0 or hold_samples < 1 or reserve < 0:
            raise ValueError("capacity, max_waiting and reserve must be >= 0 and hold_samples >= 1")
        if any(w <= 0 for w in weights.values()):
            raise ValueError(f"tier weights must be > 0, got {dict(weights)}")
        self._capacity = capacity
        self._reserve = reserve
        self._max_waiting = max_waiting
        self._clock = clock
        self._default_weight = min(weights.values(), default=1.0)
        self._default_retry_after_s = default_retry_after_s
        self._tiers = {name: _Tier(name, w) for name, w in weights.items()}
        self._running = 0
        self._vtime = 0.0
        self._seq = itertools.count()
        self._holds: deque[float] = deque(maxlen=hold_samples)

    @property
    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, capacity: int, reserve: int | None = None) -> None:
        """Follow the region's batch slots (and the free tier's headroom, when
        given). Raising it admits waiters at once; lowering it admits no one
        until running turns drop below it."""
        if capacity < 0 or (reserve is not None and reserve < 0):
            raise ValueError(f"capacity and reserve must be >= 0, got {capacity} and {reserve}")
        self._capacity = capacity
        if reserve is not None:
            self._reserve = reserve
        self._dispatch()

    def _limit(self, state: _Tier) -> int:
        """Slots ``state``'s tier may fill: all but the reserve for the lightest tiers."""
        if self._reserve and state.weight <= self._default_weight:
            return max(0, self._capacity - self._reserve)
        return self._capacity

    @contextlib.asynccontextmanager
    async def admit(self, tier: str, deadline_s: float | None = None) -> AsyncIterator[Ticket]:
        """Hold a slot for the body of the ``async with``; see :meth:`acquire`."""
        ticket = await self.acquire(tier, deadline_s)
        try:
            yield ticket
        finally:
            self.release(ticket)

    async def acquire(self, tier: str, deadline_s: float | None = None) -> Ticket:
        """Wait for a slot.

        ``deadline_s`` is how long the caller can wait (its remaining RPC
        deadline less what the turn itself needs); None waits as long as it
        takes. Raises ResourceExhausted(OVERLOADED) at once when the queue is
        full or the expected wait exceeds ``deadline_s``, and later if a
        higher tier pushes this waiter out of a full queue. A cancelled waiter
        leaves the queue; the queue does not time waiters out itself.
        """
        state = self._tier(tier)
        # Every waiter is blocked by its tier's limit (``_dispatch`` admits
        # the others), so a free slot under this tier's limit is its to take.
        if self._running < self._limit(state):
            return self._grant(state)
        self._make_room(state, deadline_s)
        waiter = _Waiter(state, next(self._seq), asyncio.get_running_loop().create_future())
        state.queue.append(waiter)
        if len(state.queue) == 1:
            self._tag_head(state)
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._leave(waiter)
            raise

    def release(self, ticket: Ticket) -> None:
        """Give a slot back and hand it to the next waiter; a second release
        of the same ticket does nothing."""
        self._release(ticket, record=True)

    def expected_wait_s(self, tier: str) -> float | None:
        """How long a turn of ``tier`` arriving now would wait for a slot;
        None while there is no service rate to go by."""
        state = self._tier(tier)
        if self._running < self._limit(state):
            return 0.0
        return self._expected_wait(state)

    def stats(self) -> QueueStats:
        return QueueStats(
            capacity=self._capacity,
            running=self._running,
            waiting={t.name: len(t.queue) for t in self._tiers.values()},
            shed={t.name: t.shed for t in self._tiers.values()},
            admitted={t.name: t.admitted for t in self._tiers.values()},
            mean_hold_s=self._mean_hold(),
        )

    # -- scheduling

    def _tier(self, name: str) -> _Tier:
        state = self._tiers.get(name)
        if state is None:
            state = self._tiers[name] = _Tier(name, self._default_weight)
        return state

    def _waiting(self) -> int:
        return sum(len(t.queue) for t in self._tiers.values())

    def _tag_head(self, state: _Tier) -> None:
        """Tag a tier's new head. ``last_finish <= V`` always, so the start is
        ``V``: an idle tier banks nothing."""
        if state.queue:
            state.head_finish = max(self._vtime, state.last_finish) + 1.0 / state.weight

    def _finish_if_appended(self, state: _Tier) -> float:
        if state.queue:
            return state.tail_finish() + 1.0 / state.weight
        return max(self._vtime, state.last_finish) + 1.0 / state.weight

    def _dispatch(self) -> None:
        while self._running < self._capacity:
            backlogged = [t for t in self._tiers.values() if t.queue and self._running < self._limit(t)]
            if not backlogged:
                break
            state = min(backlogged, key=lambda t: (t.head_finish, t.queue[0].seq))
            waiter = state.queue.popleft()
            if not waiter.future.done():  # else it was cancelled and is leaving
                self._vtime = state.last_finish = state.head_finish
                waiter.future.set_result(self._grant(state))
            self._tag_head(state)
        if not self._waiting():
            # Every tag would restart at V anyway: keep the numbers small.
            self._vtime = 0.0
            for t in self._tiers.values():
                t.last_finish = 0.0

    def _grant(self, state: _Tier) -> Ticket:
        self._running += 1
        state.admitted += 1
        return Ticket(tier=state.name, granted_at=self._clock())

    def _release(self, ticket: Ticket, *, record: bool) -> None:
        if ticket.released:
            return
        ticket.released = True
        self._running -= 1
        if record:
            self._holds.append(max(0.0, self._clock() - ticket.granted_at))
        self._dispatch()

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter's task was cancelled: leave the queue, or pass on a slot
        that was handed over just before the cancellation landed."""
        fut = waiter.future
        if fut.done() and not fut.cancelled():
            if fut.exception() is None:
                self._release(fut.result(), record=False)
            return
        queue = waiter.tier.queue
        with contextlib.suppress(ValueError):
            index = queue.index(waiter)
            del queue[index]
            if index == 0:
                self._tag_head(waiter.tier)

    # -- bounds

    def _mean_hold(self) -> float | None:
        return sum(self._holds) / len(self._holds) if self._holds else None

    def _expected_wait(self, state: _Tier) -> float | None:
        mean_hold = self._mean_hold()
        if mean_hold is None or self._capacity == 0:
            return None
        finish = self._finish_if_appended(state)
        ahead = len(state.queue)
        for other in self._tiers.values():
            if other is not state and other.queue and other.head_finish <= finish + _EPS:
                served_first = math.floor((finish - other.head_finish) * other.weight + _EPS) + 1
                ahead += min(len(other.queue), served_first)
        return (ahead + 1) * mean_hold / self._capacity

    def _make_room(self, state: _Tier, deadline_s: float | None) -> None:
        """Shed the arrival, or push out the last waiter in line, as the bounds require."""
        estimate = self._expected_wait(state)
        retry_after = self._retry_after(estimate)
        if deadline_s is not None and estimate is not None and estimate > deadline_s:
            state.shed += 1
            raise self._overloaded(
                state,
                f"a {state.name} turn would wait about {estimate:.2f} s for a slot, "
                f"longer than its {deadline_s:.2f} s deadline",
                "deadline",
                retry_after,
            )
        if self._waiting() < self._max_waiting:
            return
        victims = [t for t in self._tiers.values() if t.queue]
        victim = max(victims, key=lambda t: (t.tail_finish(), t.queue[-1].seq), default=None)
        if victim is None or victim.tail_finish() <= self._finish_if_appended(state) + _EPS:
            state.shed += 1
            raise self._overloaded(
                state, f"{self._waiting()} turns are already waiting for a slot", "queue_full", retry_after
            )
        pushed = victim.queue.pop()
        if not pushed.future.done():
            victim.shed += 1
            # As if it came back now: behind everyone still in line.
            retry_after = self._retry_after(self._expected_wait(victim))
            pushed.future.set_exception(
                self._overloaded(
                    victim, "a higher tier took this turn's place in the queue", "pushed_out", retry_after
                )
            )

    def _retry_after(self, estimate: float | None) -> float:
        return max(_MIN_RETRY_AFTER_S, self._default_retry_after_s if estimate is None else estimate)

    @staticmethod
    def _overloaded(state: _Tier, why: str, cause: str, retry_after_s: float) -> ResourceExhausted:
        return ResourceExhausted(
            Reason.OVERLOADED,
            f"the region is overloaded: {why}; retry in {retry_after_s:.2f} s",
            metadata={"tier": state.name, "cause": cause},
            retry_after_s=retry_after_s,
        )
