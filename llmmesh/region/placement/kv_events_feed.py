"""Following engine pods' KV-cache event feeds into a :class:`PrefixIndex`.

A :class:`KvEventSubscriber` holds one ``StreamKvEvents`` call per pod and
applies every batch to the index. When the call breaks it reconnects with
backoff and resumes after the last sequence the index holds, so nothing is
lost or applied twice; when the pod restarted (a new ``instance_id``) or the
pod no longer retains the events it missed (``gap``), the index drops the
pod and rebuilds from what follows (see :mod:`region.placement.kv_index`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.core.tasks import cancel_and_wait, wait_event
from llmmesh.region.engine_pool import EnginePodHandle
from llmmesh.region.placement.kv_index import PodCursor, PrefixIndex, PrefixIndexError
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

log = logging.getLogger(__name__)

# A pod restarting or draining; anything else means the pod cannot feed us
# (an old build, a bug) and the index must not trust its view of it.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


@dataclass(frozen=True)
class Backoff:
    """Exponential reconnect delays: ``initial_s`` * ``multiplier``^(n-1),
    at most ``max_s``, each shortened by up to ``jitter`` (a share) so the
    subscribers of many routers do not reconnect in step."""

    initial_s: float = 0.05
    max_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, failures: int) -> float:
        """The pause after ``failures`` consecutive failures (0: after a clean end)."""
        base = min(self.max_s, self.initial_s * self.multiplier ** max(failures - 1, 0))
        return base * (1.0 - self.jitter * random.random())


@dataclass
class FeedStats:
    """Counters of one subscriber, for tests and metrics."""

    connects: int = 0
    batches: int = 0
    events_applied: int = 0
    duplicates: int = 0
    resets: int = 0
    failures: int = 0


class KvEventSubscriber:
    """Follows ``pod_id``'s feed through ``stub`` into ``index`` until
    :meth:`stop`.

    Every loop iteration makes one attempt: open the stream after the
    index's cursor, apply batches until the stream ends or fails, then pause
    (:class:`Backoff`). With ``max_consecutive_failures`` set it gives up
    after that many failed attempts in a row; by default it never does.
    """

    def __init__(
        self,
        pod_id: str,
        stub: engine_service_pb2_grpc.EngineServiceStub,
        index: PrefixIndex,
        backoff: Backoff | None = None,
        max_consecutive_failures: int | None = None,
    ) -> None:
        self.pod_id = pod_id
        self.stats = FeedStats()
        self._stub = stub
        self._index = index
        self._backoff = backoff or Backoff()
        self._max_failures = max_consecutive_failures
        self._failures = 0
        self._cursor: PodCursor | None = None
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def cursor(self) -> PodCursor | None:
        """The index's cursor of this pod after the last applied batch."""
        return self._cursor

    def start(self) -> None:
        """Run :meth:`run` as a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"kv-events-{self.pod_id}")

    async def stop(self) -> None:
        """End the feed; what the index holds stays."""
        self._stopping.set()
        await cancel_and_wait(self._task)
        self._task = None

    async def run(self) -> None:
        """Follow the feed until :meth:`stop` (or the failure limit)."""
        while not self._stopping.is_set():
            try:
                await self._follow()
                self._failures = 0
            except grpc.aio.AioRpcError as err:
                await self._failed(f"{err.code().name}: {err.details()}")
                if err.code() not in _RETRYABLE:
                    # The pod cannot feed us: its view would only go stale.
                    with contextlib.suppress(PrefixIndexError):
                        await self._index.forget_pod(self.pod_id)
                    self._cursor = None
                    self.stats.resets += 1
            except PrefixIndexError as err:
                # The batch was not applied: the next attempt replays it.
                await self._failed(str(err))
            except grpc.aio.UsageError as err:
                # The pod's channel was closed (the region stops, or let the pod go): it can never feed again.
                log.info("kv feed of %s: ended, its channel is closed (%s)", self.pod_id, err)
                return
            if self._max_failures is not None and self._failures >= self._max_failures:
                log.error("kv feed of %s: giving up after %d failures", self.pod_id, self._failures)
                return
            await wait_event(self._stopping, self._backoff.delay(self._failures))

    async def _failed(self, why: str) -> None:
        self._failures += 1
        self.stats.failures += 1
        log.log(
            logging.INFO if self._failures == 1 else logging.DEBUG,
            "kv feed of %s broke (%s); reconnecting",
            self.pod_id,
            why,
        )

    async def _follow(self) -> None:
        """One stream, from the index's cursor until it ends or fails."""
        if self._cursor is None:
            self._cursor = await self._index.cursor(self.pod_id)
        after = self._cursor.last_sequence if self._cursor else 0
        call = self._stub.StreamKvEvents(engine_service_pb2.StreamKvEventsRequest(after_sequence=after))
        self.stats.connects += 1
        try:
            async for batch in call:
                outcome = await self._index.apply(self.pod_id, batch)
                self._cursor = outcome.cursor
                self._failures = 0
                self.stats.batches += 1
                self.stats.events_applied += outcome.applied
                self.stats.duplicates += outcome.duplicates
                if outcome.reset is not None:
                    self.stats.resets += 1
                    log.info("kv index: dropped pod %s (%s)", self.pod_id, outcome.reset.value)
                if outcome.unresolved:
                    log.debug(
                        "kv index: %d stored events of %s had unknown parents",
                        outcome.unresolved,
                        self.pod_id,
                    )
        finally:
            call.cancel()


class KvEventFeeds:
    """One subscriber per known pod of a region, all into one index."""

    def __init__(self, index: PrefixIndex, backoff: Backoff | None = None) -> None:
        self._index = index
        self._backoff = backoff
        self._subscribers: dict[str, KvEventSubscriber] = {}
        self._closed = False

    def follow(self, pods: Iterable[EnginePodHandle]) -> None:
        """Start following every pod that has answered (has a pod id) and is
        not followed yet; call it after each health round. After :meth:`close`
        (a health round may still end while the region stops) it follows none."""
        if self._closed:
            return
        for pod in pods:
            if pod.pod_id and pod.pod_id not in self._subscribers:
                subscriber = KvEventSubscriber(pod.pod_id, pod.stub, self._index, self._backoff)
                self._subscribers[pod.pod_id] = subscriber
                subscriber.start()

    def subscriber(self, pod_id: str) -> KvEventSubscriber | None:
        return self._subscribers.get(pod_id)

    async def close(self) -> None:
        self._closed = True
        for subscriber in self._subscribers.values():
            await subscriber.stop()
        self._subscribers.clear()
