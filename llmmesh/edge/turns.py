"""Opening a chat turn on the tenant's regions, best first, and reading it.

Turns run on the edge's session stream to each region
(:mod:`edge.region_session`). A region that cannot be reached, or that says
it cannot serve (UNAVAILABLE), before it accepts the turn is skipped for the
next one of the zone; a region that answers with another error ends the
turn with that error. Once accepted, a stream that breaks (the connection
lost or reset, an error event saying the region or its engine failed, or no
event for ``stall_timeout_s`` while generating) raises :class:`RegionLost`,
which :mod:`edge.failover` continues elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field

import grpc

from llmmesh.core.errors import MeshError, Reason, Unavailable, from_stream_error
from llmmesh.core.session_client import SilenceWatch
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.region_session import SessionLost, SessionTurn, start_message
from llmmesh.v1 import chat_service_pb2, common_pb2

log = logging.getLogger(__name__)

# Error events that say the region or its engine failed, not the caller or the content.
_FAILED_REASONS = frozenset({Reason.REGION_UNAVAILABLE, Reason.ENGINE_FAILED, Reason.ENGINE_UNAVAILABLE})


class RegionLost(Unavailable):
    """The region's stream broke after it accepted the turn; the turn may
    go on in another region of the zone from what was delivered.
    ``stalled``: the stream is open but sent nothing for the stall timeout
    (the region, or its pod, froze); the region may still serve a
    continuation on another of its pods."""

    def __init__(
        self, region: str, message: str, cause: MeshError | None = None, *, stalled: bool = False
    ) -> None:
        super().__init__(
            cause.reason if cause is not None else Reason.REGION_UNAVAILABLE,
            f"region {region}: {message}",
            retry_after_s=1.0,
        )
        self.region = region
        self.stalled = stalled


@dataclass
class OpenTurn:
    """A turn a region has accepted, on the edge's session stream to it.

    ``first_delta_timeout_s`` bounds the wait for its first delta (queueing
    and prefill), ``stall_timeout_s`` every later gap; None waits forever.
    """

    call: SessionTurn
    started: chat_service_pb2.ChatStarted
    usage: common_pb2.TokenUsage = field(default_factory=common_pb2.TokenUsage)
    reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    # The output filter's verdict when it flagged the reply.
    safety: chat_service_pb2.SafetyVerdict | None = None
    first_delta_timeout_s: float | None = None
    stall_timeout_s: float | None = None
    # When the turn's start was sent to the region (time.monotonic()).
    sent_s: float = 0.0

    @property
    def region(self) -> str:
        return self.started.region

    async def deltas(self) -> AsyncIterator[chat_service_pb2.ChatDelta]:
        """The turn's output deltas; ``usage``, ``reason`` and ``safety`` are
        set once it ends. A broken stream raises :class:`RegionLost`; an
        error event from the region raises its MeshError. So does a region
        that sends nothing for ``first_delta_timeout_s`` before the first
        delta, or ``stall_timeout_s`` after it (``stalled``)."""

        def stalled(limit_s: float) -> RegionLost:
            return RegionLost(self.region, f"no event for {limit_s:g} s while generating", stalled=True)

        watch: SilenceWatch | None = None
        try:
            watch = self._watch(watch, self.first_delta_timeout_s, stalled)
            while True:
                try:
                    event = await self.call.read()
                except SessionLost as err:
                    raise RegionLost(self.region, err.message) from err
                if event is None:
                    break
                kind = event.WhichOneof("event")
                if kind == "delta":
                    watch = self._watch(watch, self.stall_timeout_s, stalled)
                    yield event.delta
                elif kind == "usage":
                    self.usage = event.usage.usage
                elif kind == "safety" and event.safety.flagged:
                    self.safety = event.safety
                elif kind == "finished":
                    self.reason = event.finished.reason
                elif kind == "error":
                    error = from_stream_error(event.error)
                    if error.reason in _FAILED_REASONS:
                        raise RegionLost(self.region, error.message, error)
                    raise error
        finally:
            if watch is not None:
                watch.cancel()
        if self.reason == common_pb2.FINISH_REASON_UNSPECIFIED:
            raise RegionLost(self.region, "the stream ended without a finish event")

    def _watch(
        self, watch: SilenceWatch | None, limit_s: float | None, stalled: Callable[[float], MeshError]
    ) -> SilenceWatch | None:
        """``watch`` set to ``limit_s`` (None: no limit), started if need be."""
        if limit_s is None:
            if watch is not None:
                watch.cancel()
            return None
        if watch is None:
            return SilenceWatch(self.call, limit_s, stalled)
        watch.limit_s = limit_s
        return watch

    async def cancel(self, reason: str) -> None:
        """Ask the region to stop the turn; its usage is still metered."""
        await self.call.cancel(reason)

    def close(self) -> None:
        """Stop reading; the region stops the turn unless it ended."""
        self.call.abandon("the edge stopped reading")


def attempt_request_id(stream_id: str, attempt: int) -> str:
    """The request id of a turn's ``attempt``-th region (the first keeps the stream id)."""
    return stream_id if attempt == 1 else f"{stream_id}-r{attempt}"


def _continuation_from_nothing(start: chat_service_pb2.ChatStart, region: str) -> chat_service_pb2.ChatStart:
    """``start`` as its turn's second attempt, continuing it from no token."""
    resumed = chat_service_pb2.ChatStart()
    resumed.CopyFrom(start)
    resumed.request_id = attempt_request_id(start.request_id, 2)
    resumed.continuation.CopyFrom(
        chat_service_pb2.Continuation(original_request_id=start.request_id, original_region=region)
    )
    return resumed


async def open_turn(
    mesh: MeshClient,
    principal: Principal,
    start: chat_service_pb2.ChatStart,
    model: str,
    timeout_s: float,
    prefer_region: str = "",
    *,
    exclude: Collection[str] = (),
    tried: set[str] | None = None,
    next_request_id: Callable[[], str] | None = None,
) -> OpenTurn:
    """Start the turn on the first region of the tenant's zone that accepts it.

    ``prefer_region``, when it is one of the tenant's regions, is tried first
    (a conversation's follow-up goes to its home region); the others keep
    their order behind it. Regions in ``exclude`` are left out; each region
    tried is added to ``tried``. ``start.request_id`` must be set: it names
    the turn on the region's session stream. ``next_request_id``, when
    given, names the turn anew for each region after the first (a
    continuation's attempts: a region that accepted one and then failed may
    have started it, and its id is then taken).
    """
    regions = [r for r in await mesh.route(principal.tenant.id, model) if r.report.region not in exclude]
    if prefer_region:
        regions.sort(key=lambda r: r.report.region != prefer_region)
    last_error: MeshError | None = None
    # A region the turn was sent to that failed before answering: it may have begun it.
    unsure = ""
    n = 0
    while n < len(regions):
        region = regions[n]
        name = region.report.region
        if n and next_request_id is not None:
            start.request_id = next_request_id()
        if tried is not None:
            tried.add(name)
        session = mesh.session(region.report.chat_address)
        call = await session.start(start.request_id, start_message(start, principal.secret))
        sent_s = time.monotonic()
        n += 1
        try:
            async with asyncio.timeout(timeout_s):
                first = await call.read()
        except TimeoutError:
            call.abandon("the region did not accept the turn in time")
            mesh.forget_region(name)
            last_error = Unavailable(
                Reason.REGION_UNAVAILABLE, f"region {name} did not accept the turn in time", retry_after_s=1.0
            )
            unsure = name
            continue
        except SessionLost as err:
            log.warning("region %s unreachable (%s); trying the next", name, err.message)
            mesh.forget_region(name)
            last_error = err
            unsure = name
            continue
        kind = first.WhichOneof("event") if first is not None else None
        if kind == "error":
            assert first is not None
            error = from_stream_error(first.error)
            if error.code == grpc.StatusCode.UNAVAILABLE:
                log.warning("region %s cannot serve the turn (%s); trying the next", name, error.message)
                mesh.forget_region(name)
                last_error = error
                continue
            if unsure and error.reason == Reason.DUPLICATE_REQUEST and not start.HasField("continuation"):
                # The region that failed had begun the turn, though nothing of
                # it reached the edge: it goes on here as a continuation from nothing.
                log.warning(
                    "turn %s: region %s began it before it failed; continuing it in region %s",
                    start.request_id,
                    unsure,
                    name,
                )
                start = _continuation_from_nothing(start, unsure)
                unsure = ""
                n -= 1
                continue
            raise error
        if kind != "started" or first is None:
            call.abandon("the turn opened without a started event")
            raise Unavailable(Reason.REGION_UNAVAILABLE, f"the region opened the stream with {kind!r}")
        return OpenTurn(call=call, started=first.started, sent_s=sent_s)
    raise last_error or Unavailable(Reason.NO_REGION_IN_ZONE, "no region can serve this request")
