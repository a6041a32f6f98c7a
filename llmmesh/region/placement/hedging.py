"""Request hedging for premium tiers: when a turn's pod has produced no
token ``after_s`` after the turn started there, the same turn starts on a
second pod; the first of the two to produce a token wins, the other is
abandoned (the pod aborts it: its batch slot and KV blocks free at its next
step).

Only the winner's events reach the gateway, so the turn is metered and
billed once, for the winner: the loser's prompt and tokens are never seen.
Hedges started, won by the backup and losers aborted are counted
(:mod:`region.metrics_phases`).
A turn hedges when its engine priority is at most ``max_priority`` (0:
enterprise only; :func:`region.admission.fair_queue.engine_priority`) and the router
has a second pod for it. A pod that fails before its first token does not
win; the other still may.

The router hands the gateway the first pod's :class:`~region.engine_pool.PodView`
(:func:`hedged_pod`), whose session starts a :class:`HedgedGeneration` in
place of a plain one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmmesh.core.errors import MeshError
from llmmesh.core.session_client import SessionClient, SessionRequest
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region import metrics_phases
from llmmesh.region.engine_pool import EnginePodHandle, PodView
from llmmesh.region.engine_session import SessionGeneration
from llmmesh.v1 import engine_service_pb2 as pb

log = logging.getLogger(__name__)

HEDGE_SUFFIX = ":hedge"

BackupPod = Callable[[], Awaitable[EnginePodHandle | None]]


@dataclass(frozen=True)
class HedgingPolicy:
    """When a turn hedges: ``after_s`` without a first token (0: never), for
    engine priorities up to ``max_priority``."""

    after_s: float = 0.0
    max_priority: int = 0

    def __post_init__(self) -> None:
        if not self.after_s >= 0.0:
            raise ValueError("the hedging deadline must not be negative (0 turns hedging off)")

    @property
    def enabled(self) -> bool:
        return self.after_s > 0.0

    def applies(self, priority: int) -> bool:
        return self.enabled and priority <= self.max_priority


class _Leg:
    """One pod's generation of the turn, read up to its first token."""

    def __init__(self, pod: EnginePodHandle, generation: SessionGeneration) -> None:
        self.pod = pod
        self.generation = generation
        self.buffered: list[pb.GenerationEvent] = []
        self.reader = asyncio.create_task(self._first_token())

    async def _first_token(self) -> bool:
        """Whether the leg produced a token; False when it ended without."""
        while (event := await self.generation.read()) is not None:
            self.buffered.append(event)
            kind = event.WhichOneof("event")
            if kind == "delta":
                return True
            if kind in ("finished", "error"):
                # A reply without a token still counts; an error does not.
                return kind == "finished"
        return False

    def won(self) -> bool:
        """The leg produced a token (its reader finished True)."""
        task = self.reader
        return task.done() and task.exception() is None and task.result()


class HedgedGeneration(SessionRequest[pb.GenerateSessionRequest, pb.GenerationEvent]):
    """The turn's generation on its first pod and, after the deadline, on a
    backup pod; reads as the winner's events."""

    def __init__(
        self,
        first: _Leg,
        backup: BackupPod,
        message: pb.GenerateSessionRequest,
        after_s: float,
    ) -> None:
        # Deliberately not SessionRequest.__init__: events come from the legs.
        self.request_id = first.generation.request_id
        self.ended = False
        self._legs = [first]
        self._backup = backup
        self._message = message
        self._after_s = after_s
        self._winner: _Leg | None = None

    @property
    def _reading(self) -> list[_Leg]:
        """The legs whose events the turn may read: the winner's once there is one."""
        return self._legs if self._winner is None else [self._winner]

    @property
    def last_event_s(self) -> float:
        return max((leg.generation.last_event_s for leg in self._reading), default=0.0)

    @property
    def unread(self) -> int:
        return sum(len(leg.buffered) + leg.generation.unread for leg in self._reading)

    def interrupt(self, error: MeshError) -> None:
        # Before a winner, every leg's reader stops on it, and the first leg's failure is the turn's.
        for leg in self._reading:
            leg.generation.interrupt(error)

    async def read(self) -> pb.GenerationEvent | None:
        if self._winner is None:
            self._winner = await self._race()
        winner = self._winner
        event: pb.GenerationEvent | None
        if winner.buffered:
            event = winner.buffered.pop(0)
        else:
            try:
                event = await winner.generation.read()
            except MeshError:
                self.ended = True
                raise
        if event is None or event.WhichOneof("event") in ("finished", "error"):
            self.ended = True
        return event

    async def _race(self) -> _Leg:
        first = self._legs[0]
        done, _ = await asyncio.wait({first.reader}, timeout=self._after_s)
        if not done:
            second = await self._start_backup()
            if second is not None:
                self._legs.append(second)
                metrics_phases.hedge_started()
        pending = {leg.reader for leg in self._legs}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = next((leg for leg in self._legs if leg.reader in done and leg.won()), None)
            if winner is not None:
                break
        else:
            # Neither produced a token: the first leg's end is the turn's.
            winner = first
        for leg in self._legs:
            if leg is not winner:
                await self._drop(leg, "the hedged turn was won by another pod")
                metrics_phases.hedge_loser_aborted()
        if winner is not first:
            metrics_phases.hedge_won()
        if len(self._legs) > 1:
            log.info("turn %s: hedged; %s won", self.request_id, winner.pod.pod_id)
        failure = winner.reader.exception()
        if failure is not None:
            raise failure
        return winner

    async def _start_backup(self) -> _Leg | None:
        pod = await self._backup()
        if pod is None:
            return None
        message = pb.GenerateSessionRequest()
        message.CopyFrom(self._message)
        message.start.request_id = self.request_id + HEDGE_SUFFIX
        try:
            generation = await pod.session.start(message.start.request_id, message)
        except MeshError as error:
            log.warning("turn %s: hedge on %s did not start: %s", self.request_id, pod.pod_id, error)
            return None
        pod.in_flight += 1
        return _Leg(pod, generation)

    async def _drop(self, leg: _Leg, reason: str) -> None:
        # A leg that failed is dropped as it is: its error is not the turn's.
        with contextlib.suppress(Exception):
            await cancel_and_wait(leg.reader)
        leg.generation.abandon(reason)

    async def cancel(self, reason: str) -> None:
        for leg in self._legs if self._winner is None else [self._winner]:
            await leg.generation.cancel(reason)

    def abandon(self, reason: str) -> None:
        for leg in self._legs:
            if not leg.reader.done():
                leg.reader.cancel()
            leg.generation.abandon(reason)
            if leg is not self._legs[0]:
                leg.pod.in_flight -= 1
        self._legs = self._legs[:1] if self._legs else []


class HedgedSession(SessionClient[pb.GenerateSessionRequest, pb.GenerationEvent]):
    """The first pod's session; a premium turn's start is hedged."""

    def __init__(self, first: EnginePodHandle, backup: BackupPod, policy: HedgingPolicy) -> None:
        # Deliberately not SessionClient.__init__: this opens no stream of its own.
        self._first = first
        self._backup = backup
        self._policy = policy

    async def start(self, request_id: str, message: pb.GenerateSessionRequest) -> SessionGeneration:
        generation = await self._first.session.start(request_id, message)
        if not self._policy.applies(message.start.priority):
            return generation
        return HedgedGeneration(_Leg(self._first, generation), self._backup, message, self._policy.after_s)

    async def close(self) -> None:
        """Nothing to close: the pods' sessions belong to the pool."""


def hedged_pod(first: EnginePodHandle, backup: BackupPod, policy: HedgingPolicy) -> PodView:
    """The first pod, its session hedging premium turns onto ``backup()``."""
    return PodView(first, HedgedSession(first, backup, policy))
