"""Mid-stream failover: a turn as its client sees it, one unbroken stream,
across the regions of the zone that serve it.

When the serving region's stream breaks after it accepted the turn
(:class:`edge.turns.RegionLost`), the turn is issued again to the next
healthy region of the tenant's zone (geo-routing is asked again, leaving
out every region that failed this turn) as a continuation of what the
client already has: the same messages, sampling and conversation, and a
``Continuation`` with the original request id (the stream id), the failed
region, every token id, the text and the tool calls (merged from their
parts) delivered, and the last sequence number. The attempt's own request id is ``<stream id>-r<n>``. The new
region resumes after those tokens and numbers its deltas on from the last,
so the client sees no token lost or repeated; its usage is the whole
turn's.

Bounded: each region of the zone is tried at most once per turn, and all
failovers of a turn share ``failover_deadline_s`` from the first break.
When no region is left, the stream ends with the failed region's error,
saying that no other region of the zone could continue it (never silently,
and never in another zone). A turn being cancelled or closed is not failed over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from llmmesh.edge import metrics
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.turn_spans import TurnSpans
from llmmesh.edge.turns import OpenTurn, RegionLost, open_turn
from llmmesh.core.errors import MeshError, Reason, Unavailable
from llmmesh.core.tool_calls import ToolCallMerger
from llmmesh.v1 import chat_service_pb2, common_pb2

log = logging.getLogger(__name__)

# A region answering the continuation with these may have a peer that can take it.
_TRY_NEXT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class FailoverPolicy:
    """How long each step of a failover may take."""

    # For a region to accept the continuation, and for its first delta.
    first_event_timeout_s: float
    # The longest silence of a generating stream before it counts as broken.
    stall_timeout_s: float
    # All of one turn's failovers, from its first break.
    deadline_s: float


def attempt_request_id(stream_id: str, attempt: int) -> str:
    """The request id of a turn's ``attempt``-th region (the first keeps the stream id)."""
    return stream_id if attempt == 1 else f"{stream_id}-r{attempt}"


class FailoverTurn:
    """A turn's deltas across its serving regions; ``usage``, ``reason``
    and ``safety`` are the last region's (its usage is the whole turn's)."""

    def __init__(
        self,
        mesh: MeshClient,
        principal: Principal,
        start: chat_service_pb2.ChatStart,
        model: str,
        first: OpenTurn,
        policy: FailoverPolicy,
        spans: TurnSpans | None = None,
    ) -> None:
        self._mesh = mesh
        self._principal = principal
        self._start = start
        self._model = model
        self._turn = first
        self._policy = policy
        first.first_delta_timeout_s = policy.first_event_timeout_s
        first.stall_timeout_s = policy.stall_timeout_s
        self.started = first.started
        self._token_ids: list[int] = []
        self._text: list[str] = []
        self._calls = ToolCallMerger()
        self._last_sequence = 0
        self._failed: set[str] = set()
        self._attempt = 1
        self._deadline: float | None = None
        # Once the turn is being cancelled or closed, a break ends it.
        self._cancelled: str | None = None
        self._closed = False
        self._spans = spans if spans is not None else TurnSpans(model, start.request_id)

    @property
    def region(self) -> str:
        """The region serving the turn now."""
        return self._turn.region

    @property
    def usage(self) -> common_pb2.TokenUsage:
        return self._turn.usage

    @property
    def reason(self) -> common_pb2.FinishReason.ValueType:
        return self._turn.reason

    @property
    def safety(self) -> chat_service_pb2.SafetyVerdict | None:
        return self._turn.safety

    async def deltas(self) -> AsyncIterator[chat_service_pb2.ChatDelta]:
        """Every delta of the turn, once, whichever region produced it.
        Raises MeshError when the turn ends in an error."""
        try:
            while True:
                try:
                    async for delta in self._turn.deltas():
                        self._token_ids.extend(delta.token_ids)
                        self._text.append(delta.text)
                        self._calls.add(delta.tool_calls)
                        self._last_sequence = max(self._last_sequence, delta.sequence)
                        yield delta
                    break
                except RegionLost as lost:
                    if self._cancelled is not None or self._closed:
                        raise
                    self._turn.close()
                    self._spans.failed_over(lost.region, lost.message)
                    with self._spans.current():
                        self._turn = await self._fail_over(lost)
                    self._spans.opened(self._turn.started)
                    await self._stop_if_asked()
        except BaseException as err:
            self._spans.fail(err)
            raise
        self._spans.finish(self.usage, self.reason)

    async def cancel(self, reason: str) -> None:
        """Ask the serving region to stop the turn; its usage is still metered."""
        self._cancelled = reason
        await self._turn.cancel(reason)

    def close(self) -> None:
        self._closed = True
        self._turn.close()
        self._spans.fail("the edge stopped reading the turn")

    async def _stop_if_asked(self) -> None:
        """Stop a continuation opened while the turn was being cancelled or closed."""
        if self._closed:
            self._turn.close()
        elif self._cancelled is not None:
            await self._turn.cancel(self._cancelled)

    async def _fail_over(self, lost: RegionLost) -> OpenTurn:
        """The turn opened as a continuation on the next region of the zone."""
        failed = lost.region
        self._failed.add(failed)
        self._mesh.forget_region(failed)
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._policy.deadline_s
        self._attempt += 1
        stream_id = self._start.request_id
        start = chat_service_pb2.ChatStart()
        start.CopyFrom(self._start)
        start.request_id = attempt_request_id(stream_id, self._attempt)
        start.continuation.CopyFrom(
            chat_service_pb2.Continuation(
                original_request_id=stream_id,
                original_region=failed,
                emitted_token_ids=self._token_ids,
                emitted_text="".join(self._text),
                last_sequence=self._last_sequence,
                emitted_tool_calls=self._calls.calls(),
            )
        )
        log.warning(
            "stream %s: region %s failed after %d tokens (%s); continuing in the zone",
            stream_id,
            failed,
            len(self._token_ids),
            lost.message,
        )
        try:
            async with asyncio.timeout_at(self._deadline):
                turn = await self._open(start)
        except (MeshError, TimeoutError) as err:
            metrics.FAILOVERS.labels(outcome="failed").inc()
            why = err.message if isinstance(err, MeshError) else "none accepted it in time"
            log.error("stream %s: no region of the zone could continue it: %s", stream_id, why)
            if (
                isinstance(err, MeshError)
                and err.code not in _TRY_NEXT
                and err.reason != Reason.NO_REGION_IN_ZONE
            ):
                raise
            # The turn ends with its region's failure, saying why it could not go on.
            raise Unavailable(
                lost.reason,
                f"{lost.message}; no other region of zone {self.started.zone or 'of the tenant'} "
                f"could continue the turn ({why})",
                retry_after_s=1.0,
            ) from err
        turn.first_delta_timeout_s = self._policy.first_event_timeout_s
        turn.stall_timeout_s = self._policy.stall_timeout_s
        metrics.FAILOVERS.labels(outcome="continued").inc()
        log.warning(
            "stream %s: failed over from region %s to %s carrying %d tokens",
            stream_id,
            failed,
            turn.region,
            len(self._token_ids),
        )
        return turn

    async def _open(self, start: chat_service_pb2.ChatStart) -> OpenTurn:
        """Open ``start`` on the first region of the zone not tried yet that
        accepts it; a region that is down or overloaded passes to the next."""
        while True:
            try:
                return await open_turn(
                    self._mesh,
                    self._principal,
                    start,
                    self._model,
                    self._policy.first_event_timeout_s,
                    exclude=self._failed,
                    tried=self._failed,
                )
            except MeshError as err:
                if err.code not in _TRY_NEXT or err.reason == Reason.NO_REGION_IN_ZONE:
                    raise
                log.warning("stream %s: a region refused the continuation: %s", self._start.request_id, err)
