"""Mid-stream failover: a turn as its client sees it, one unbroken stream,
across the regions of the zone that serve it.

When the serving region's stream breaks after it accepted the turn
(:class:`edge.turns.RegionLost`), the turn is issued again to the next
healthy region of the tenant's zone (geo-routing is asked again, leaving
out every region that failed this turn) as a continuation of what the
client already has: the same messages, sampling and conversation, and a
``Continuation`` with the original request id (the stream id), the failed
region, every token id, the text and the tool calls (merged from their
parts) delivered, and the last sequence number. Each region tried gets an attempt request id of its
own, ``<stream id>-r<n>``, so a region that took the continuation and then
failed too never holds up the next (the zone keeps the latest attempt as
the turn's continuation, and the one it replaced cannot start). The new
region resumes after those tokens and numbers its deltas on from the last,
so the client sees no token lost or repeated; its usage is the whole
turn's.

Bounded: each region of the zone is tried at most once per turn, and all
failovers of a turn share ``failover_deadline_s`` from the first break.
When no region is left, the stream ends with the failed region's error,
saying that no other region of the zone could continue it (never silently,
and never in another zone). A turn being cancelled or closed is not failed over.

A turn failed so (``lost_by_mesh``) is billed no more output than its
client received: :meth:`FailoverTurn.settle` tells a region of the zone
(``ChatService.SettleTurn``, as the edge, with the turn's key) how many
output tokens were delivered, and the zone's usage rows of the turn are
settled to that. So is a turn that was continued and ended
(``settles_when_done``): a region it left only slow generated on until it
noticed, and its count is not the client's. A turn its client cancels or
leaves is billed what its regions generated, as OpenAI bills it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from llmmesh.core.errors import MeshError, Reason, Unavailable
from llmmesh.core.tool_calls import ToolCallMerger
from llmmesh.edge import metrics
from llmmesh.edge.errors import from_mesh_error
from llmmesh.edge.mesh_client import MeshClient, Metadata, Principal
from llmmesh.edge.traffic_series import TurnTraffic
from llmmesh.edge.turn_spans import TurnSpans
from llmmesh.edge.turns import OpenTurn, RegionLost, attempt_request_id, open_turn
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2

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


SETTLE_DEADLINE_S = 30.0
"""How long the edge keeps trying to settle a failed turn (the zone's
regions may be restarting); past it the failure is logged and counted."""
_SETTLE_CALL_TIMEOUT_S = 5.0
_SETTLE_RETRY_S = 1.0


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
        arrived_s: float | None = None,
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
        # Regions that stalled and were given the turn again (once each).
        self._stalled_retried: set[str] = set()
        # The first region's attempt: 2 when it opened as a continuation (see open_turn).
        self._attempt = 1 if first.call.request_id == start.request_id else 2
        self._deadline: float | None = None
        # Once the turn is being cancelled or closed, a break ends it.
        self._cancelled: str | None = None
        self._closed = False
        # The turn ended because no region could go on with it: the mesh's fault.
        self.lost_by_mesh = False
        # Another region continued the turn.
        self.continued = False
        self._spans = spans if spans is not None else TurnSpans(model, start.request_id)
        # Its share of the operator page's charts, timed from arrived_s (else its start sent).
        self._traffic = TurnTraffic(model, first.region, first.sent_s if arrived_s is None else arrived_s)

    @property
    def region(self) -> str:
        """The region serving the turn now."""
        return self._turn.region

    @property
    def delivered_tokens(self) -> int:
        """Output tokens of every delta handed on so far, across the turn's regions."""
        return len(self._token_ids)

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
                        self._traffic.delta(self.region, len(delta.token_ids))
                        yield delta
                    break
                except RegionLost as lost:
                    if self._cancelled is not None or self._closed:
                        raise
                    self._turn.close()
                    self._spans.failed_over(lost.region, lost.message)
                    with self._spans.current():
                        try:
                            self._turn = await self._fail_over(lost)
                        except BaseException:
                            self.lost_by_mesh = True
                            raise
                    self.continued = True
                    self._spans.opened(self._turn.started)
                    await self._stop_if_asked()
        except BaseException as err:
            self._spans.fail(err)
            if isinstance(err, MeshError):
                self._traffic.failed(self.region, from_mesh_error(err).code)
            raise
        self._spans.finish(self.usage, self.reason)

    @property
    def settles_when_done(self) -> bool:
        """Whether the turn, ended whole, is settled to what was delivered:
        one that another region continued, unless its client cancelled or
        left it (that is billed what was generated)."""
        return self.continued and self._cancelled is None and not self._closed

    async def cancel(self, reason: str) -> None:
        """Ask the serving region to stop the turn; its usage is still metered."""
        self._cancelled = reason
        await self._turn.cancel(reason)

    def close(self) -> None:
        self._closed = True
        self._turn.close()
        self._spans.fail("the edge stopped reading the turn")

    async def settle(self, delivered: int) -> None:
        """Have the zone bill this turn, which the mesh failed or continued,
        the ``delivered`` output tokens its client received (see the module
        docstring). Retried on the zone's regions while they are
        unreachable, up to ``SETTLE_DEADLINE_S``; never raises."""
        request = chat_service_pb2.SettleTurnRequest(
            request_id=self._start.request_id, delivered_output_tokens=delivered
        )

        async def call(
            stub: chat_service_pb2_grpc.ChatServiceStub, metadata: Metadata
        ) -> chat_service_pb2.SettleTurnResponse:
            settled: chat_service_pb2.SettleTurnResponse = await stub.SettleTurn(
                request, metadata=metadata, timeout=_SETTLE_CALL_TIMEOUT_S
            )
            return settled

        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_DEADLINE_S
        while True:
            try:
                settled = await self._mesh.in_zone(self._principal, call)
            except MeshError as err:
                if err.code in _TRY_NEXT and loop.time() + _SETTLE_RETRY_S < deadline:
                    await asyncio.sleep(_SETTLE_RETRY_S)
                    continue
                metrics.SETTLEMENTS.labels(outcome="failed").inc()
                log.error(
                    "stream %s: could not settle its usage to the %d output tokens delivered: %s",
                    request.request_id,
                    delivered,
                    err.message,
                )
                return
            outcome = "over_billed" if settled.over_billed_output_tokens else "settled"
            metrics.SETTLEMENTS.labels(outcome=outcome).inc()
            log.info(
                "stream %s: usage settled to the %d output tokens delivered "
                "(%d more that billing had already taken stay billed)",
                request.request_id,
                delivered,
                settled.over_billed_output_tokens,
            )
            return

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
        stream_id = self._start.request_id
        start = chat_service_pb2.ChatStart()
        start.CopyFrom(self._start)
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
                turn = await self._open_after(lost, start)
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

    async def _open_after(self, lost: RegionLost, start: chat_service_pb2.ChatStart) -> OpenTurn:
        """Open the continuation on another region of the zone; when none
        takes it and the lost region only stalled (a frozen pod, a wedged
        batch), on that region again, once: it places the continuation on
        another of its pods, which is all a zone of one region can do."""
        try:
            return await self._open(start)
        except MeshError as err:
            again = lost.stalled and lost.region not in self._stalled_retried
            if not again or err.code not in _TRY_NEXT:
                raise
        self._stalled_retried.add(lost.region)
        self._failed.discard(lost.region)
        log.warning(
            "stream %s: no other region took it; continuing in region %s, which stalled",
            self._start.request_id,
            lost.region,
        )
        return await self._open(start)

    def _next_request_id(self) -> str:
        self._attempt += 1
        return attempt_request_id(self._start.request_id, self._attempt)

    async def _open(self, start: chat_service_pb2.ChatStart) -> OpenTurn:
        """Open ``start`` on the first region of the zone not tried yet that
        accepts it; a region that is down or overloaded passes to the next."""
        while True:
            start.request_id = self._next_request_id()
            try:
                return await open_turn(
                    self._mesh,
                    self._principal,
                    start,
                    self._model,
                    self._policy.first_event_timeout_s,
                    exclude=self._failed,
                    tried=self._failed,
                    next_request_id=self._next_request_id,
                )
            except MeshError as err:
                if err.code not in _TRY_NEXT or err.reason == Reason.NO_REGION_IN_ZONE:
                    raise
                log.warning("stream %s: a region refused the continuation: %s", self._start.request_id, err)
