"""Streaming a turn on one engine pod: the pod's generation over its shared
session, every delta through the streaming output safety filter (a block
ends the stream with ``content_filter``), deltas numbered on from a
continuation's last one, and the turn's usage and finish once its record
is written.

A continuation (``ChatStart.continuation``) resumes after the tokens its
client already has: the pod is given them, the output filter is seeded
with their text (a flagged phrase spanning the break is still caught), and
the usage it reports is the whole turn's.

Tools: a pod's tool-call parts and logprobs go on to the caller with the
delta they came in, each call under the id
:func:`region.turn.tool_calls.tool_call_id` gives it, derived from the
turn's original request id, so a continuation names a call as the first
region did. The output filter reads call arguments as it reads content;
their tokens are output tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import timestamp_pb2

from llmmesh.core import tracing
from llmmesh.core.errors import MeshError, Reason, Unavailable, from_stream_error
from llmmesh.core.pricing import format_usd
from llmmesh.core.session_client import SilenceWatch
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.fair_queue import engine_priority
from llmmesh.region.admission.rate_limit_status import rate_limit_status
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.engine_session import SessionGeneration
from llmmesh.region.modelchoice.model_policy import turn_cost
from llmmesh.region.safety import SafetyFilters
from llmmesh.region.settings import RegionSettings
from llmmesh.region.turn.admit import TurnAdmission
from llmmesh.region.turn.filtered_output import FilteredOutput
from llmmesh.region.turn.record import TurnRecorder, now
from llmmesh.region.turn.state import Turn
from llmmesh.region.turn.tool_calls import rewrite_ids
from llmmesh.v1 import chat_service_pb2, common_pb2, engine_service_pb2

log = logging.getLogger(__name__)

# How a pod's failure reaches a turn: its session broke (UNAVAILABLE), or it
# cancelled its generations as it went away; another pod may run the turn.
_POD_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
# How often a turn waiting for its pod's first event looks at the pod's health.
_HEALTH_WATCH_S = 0.25
# A turn waiting this long for its pod's first event is named in the log,
# with the pod's state: a queue that long, or a pod that took the turn and
# went quiet, is worth an operator's look.
SLOW_FIRST_EVENT_S = 10.0


class PodFailedEarly(Exception):
    """The pod failed before the turn produced anything: another pod may run it."""


class PodFailedMidStream(Exception):
    """The turn's generation failed after its first event, and not by the
    caller's cancel: another pod of the model may go on from what was
    delivered. ``pod_gone``: the pod's session broke (the pod is down),
    rather than the pod ending this one generation with an error."""

    def __init__(self, error: MeshError, *, pod_gone: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.pod_gone = pod_gone


def generation_id(request_id: str, holder: str) -> str:
    """The id of a turn's generation on a pod. Request ids are each tenant's
    own, so two tenants' turns of one id may run on one pod at once; this
    acceptance's holder (a fixed-length random token) tells them apart."""
    return f"{request_id}.{holder}"


class PodStream:
    """The stream stage: one turn's generation on one pod, as caller events."""

    def __init__(
        self,
        settings: RegionSettings,
        safety: SafetyFilters | None,
        admission: TurnAdmission,
        recorder: TurnRecorder,
        clock: Callable[[], timestamp_pb2.Timestamp] = now,
        pool: EnginePool | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._safety = safety
        self._admission = admission
        self._recorder = recorder
        self._now = clock

    async def run(
        self,
        pod: EnginePodHandle,
        start: chat_service_pb2.ChatStart,
        turn: Turn,
        cancel: asyncio.Event,
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        """The turn's events from ``pod``, which may take the turn over from
        a pod that failed mid-stream: it is given the output delivered so far
        and goes on after it. :class:`PodFailedEarly` when the pod fails
        before the turn produced anything, :class:`PodFailedMidStream` when
        it fails later; any other error after the first event ends the
        stream with an ``error`` event."""
        prepared, meter = turn.prepared, turn.meter
        base_sequence = start.continuation.last_sequence if start.HasField("continuation") else 0
        output = FilteredOutput(self._safety.new_output_filter() if self._safety is not None else None)
        # What the client has: a flagged phrase spanning the break is still caught.
        await output.seed(meter.reply_text() + meter.tool_calls.text())
        resume = [*start.continuation.emitted_token_ids, *meter.delivered_token_ids]
        # Counted before the first await: the router reads it for the next turn.
        pod.in_flight += 1
        generation: SessionGeneration | None = None
        forward: asyncio.Task[None] | None = None
        watch: SilenceWatch | None = None
        engine_request_id = generation_id(prepared.request_id, turn.holder)
        # Whether the pod itself ended the generation with an error event (it is up).
        ended_by_pod = False
        # Whether the zone store is being asked to let the first event out: its refusal is not the pod's.
        holding = False
        try:
            generation = await pod.session.start(
                engine_request_id,
                engine_service_pb2.GenerateSessionRequest(
                    start=engine_service_pb2.GenerateStart(
                        request_id=engine_request_id,
                        model=prepared.model.name,
                        # The prompt as the router tokenized it (a pod's own
                        # tokens), so the pod does not render it again.
                        prompt_token_ids=prepared.token_ids,
                        sampling=start.sampling,
                        priority=engine_priority(turn.caller.tier),
                        resume_output_token_ids=resume,
                        trace_context=tracing.trace_context_message(),
                    )
                ),
            )
            hops = turn.hops if not meter.started else None
            if hops is not None:
                hops.stamp("pod_send")
            if meter.started:  # a pod that takes the turn over
                watch = self._watch(generation, pod)
            forward = asyncio.create_task(self._forward_cancel(generation, cancel))
            events = aiter(generation)
            while True:
                try:
                    resp = await self._next_event(
                        events, pod, prepared.model.name, started=meter.started, request_id=engine_request_id
                    )
                except StopAsyncIteration:
                    break
                kind = resp.WhichOneof("event")
                if kind == "started":
                    # Counted even if the id was lost: the prompt was prefilled.
                    meter.prompt(resp.started.prompt_tokens, resp.started.cached_prompt_tokens)
                    if meter.started:
                        continue  # a pod that took the turn over: the caller has its start
                    if hops is not None:
                        hops.stamp("pod_first_event")
                    holding = True
                    await self._admission.hold_request_id(turn)
                    holding = False
                    if hops is not None:
                        hops.stamp("request_id_hold")
                    meter.started = True
                    watch = self._watch(generation, pod)
                    yield chat_service_pb2.ChatResponse(
                        started=chat_service_pb2.ChatStarted(
                            request_id=prepared.request_id,
                            region=self._settings.region,
                            zone=self._settings.zone,
                            pod_id=resp.started.pod_id or pod.pod_id,
                            model=prepared.model.name,
                            conversation_id=prepared.conversation_id or "",
                            create_time=self._now(),
                            rate_limit=rate_limit_status(turn.admitted.reservation),
                            parent_message_id=prepared.context.follows if prepared.context else "",
                            context=prepared.context.report if prepared.context else None,
                        )
                    )
                elif kind == "delta":
                    delta = resp.delta
                    if hops is not None:
                        hops.stamp_once("pod_first_delta")
                    # Ids of the region's own, the same in every region that serves the turn.
                    calls = rewrite_ids(delta.tool_calls, turn.caller.tenant_id, prepared.original_request_id)
                    release = await output.feed(
                        delta.text, tuple(delta.token_ids), tuple(calls), tuple(delta.logprobs)
                    )
                    if release:
                        if hops is not None:
                            hops.stamp_once("output_filter")
                            hops.observe(region_metrics.HOPS)
                            hops = None  # every hop of the turn is timed: no more stamps per delta
                        yield meter.deliver(base_sequence, release)
                    elif output.stopped is not None:
                        break
                elif kind == "error":
                    ended_by_pod = True
                    raise from_stream_error(resp.error)
                elif kind == "finished":
                    finished = resp.finished
                    if finished.HasField("usage"):
                        meter.prompt(
                            finished.usage.input_tokens or meter.input_tokens + meter.resumed_context,
                            finished.usage.cached_input_tokens,
                        )
                    release = await output.finish()
                    if release:
                        if hops is not None:
                            hops.stamp_once("output_filter")
                            hops.observe(region_metrics.HOPS)
                        yield meter.deliver(base_sequence, release)
                    if output.stopped is None:
                        meter.reason = finished.reason
                        async for event in self._end(turn, finished.reason):
                            yield event
                        return
                    break
            if output.stopped is not None:
                async for event in self._stopped_by_filter(turn, output):
                    yield event
                return
            raise Unavailable(Reason.ENGINE_FAILED, "the engine stream ended without a finish event")
        except MeshError as error:
            if holding:
                raise
            pod_failed = error.code in _POD_FAILURES and not cancel.is_set()
            if not meter.started and pod_failed:
                raise PodFailedEarly from error
            if error.code == grpc.StatusCode.UNAVAILABLE and error.reason != Reason.ENGINE_FAILED:
                error = Unavailable(
                    Reason.ENGINE_FAILED,
                    f"engine pod {pod.pod_id} failed mid-stream: {error.message}",
                    retry_after_s=1.0,
                )
            if not meter.started:
                raise error from None
            if pod_failed:
                raise PodFailedMidStream(error, pod_gone=not ended_by_pod) from error
            yield self.failed(turn, error)
        finally:
            pod.in_flight -= 1
            if watch is not None:
                watch.cancel()
            await cancel_and_wait(forward)
            if generation is not None:
                # The pod aborts a generation its turn stopped reading.
                generation.abandon("the turn stopped reading")

    def _watch(self, generation: SessionGeneration, pod: EnginePodHandle) -> SilenceWatch | None:
        """The watch of a started generation: a pod that sends it nothing
        for ``pod_stall_ms`` has stalled (frozen, cut off, its batch
        wedged): UNAVAILABLE ``ENGINE_FAILED``, so another pod goes on with
        the turn. None where stalls are not watched."""
        stall_s = self._settings.pod_stall_ms / 1000
        if stall_s <= 0:
            return None

        def stalled(silent_s: float) -> MeshError:
            region_metrics.pod_stalled(pod.pod_id)
            return Unavailable(
                Reason.ENGINE_FAILED, f"engine pod {pod.pod_id} sent nothing for {silent_s:g} s mid-stream"
            )

        return SilenceWatch(generation, stall_s, stalled)

    async def _next_event(
        self,
        events: AsyncIterator[engine_service_pb2.GenerationEvent],
        pod: EnginePodHandle,
        model: str,
        *,
        started: bool,
        request_id: str = "",
    ) -> engine_service_pb2.GenerationEvent:
        """The generation's next event. Once the turn has started, a
        :class:`SilenceWatch` (see :meth:`_watch`) ends the wait of a pod that sends nothing for
        ``pod_stall_ms``. Before the first event the wait is the queue's, not
        a stall, unless :meth:`_first_event` finds the pod down."""
        if not started:
            return await self._first_event(events, pod, model, request_id)
        return await anext(events)

    async def _first_event(
        self,
        events: AsyncIterator[engine_service_pb2.GenerationEvent],
        pod: EnginePodHandle,
        model: str,
        request_id: str = "",
    ) -> engine_service_pb2.GenerationEvent:
        """The generation's first event, however long the pod's queue
        holds it, unless the pool's health checks find the pod down (a
        frozen or cut-off pod took the turn before they noticed) while a
        healthy pod of the model could run it: UNAVAILABLE, so the turn is
        placed again. A region with no other pod keeps waiting: the edge's
        first-event timeout decides. A wait past :data:`SLOW_FIRST_EVENT_S`
        is logged once."""
        if self._pool is None:
            return await anext(events)
        waiting = asyncio.ensure_future(anext(events))
        loop = asyncio.get_running_loop()
        since, logged = loop.time(), False
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=_HEALTH_WATCH_S)
                if done:
                    if logged:
                        log.info(
                            "generation %s: first event from engine pod %s after %.1f s",
                            request_id,
                            pod.pod_id,
                            loop.time() - since,
                        )
                    return waiting.result()
                if not logged and loop.time() - since >= SLOW_FIRST_EVENT_S:
                    logged = True
                    log.warning(
                        "generation %s: no first event from engine pod %s after %.1f s "
                        "(pod %s, %d generations in flight on it; another healthy pod serves %s: %s)",
                        request_id,
                        pod.pod_id,
                        loop.time() - since,
                        "healthy" if pod.healthy else "down",
                        pod.in_flight,
                        model,
                        "yes" if self._pool.serves_elsewhere(model, pod) else "no",
                    )
                if not pod.healthy and self._pool.serves_elsewhere(model, pod):
                    region_metrics.pod_stalled(pod.pod_id)
                    raise Unavailable(
                        Reason.ENGINE_FAILED,
                        f"engine pod {pod.pod_id} failed its health checks before the turn started",
                    )
        finally:
            if not waiting.done():
                waiting.cancel()

    @staticmethod
    def failed(turn: Turn, error: MeshError) -> chat_service_pb2.ChatResponse:
        """The error event that ends a turn after its first event."""
        turn.meter.reason = common_pb2.FINISH_REASON_ERROR
        region_metrics.turn_failed(error)
        return chat_service_pb2.ChatResponse(error=error.to_stream_error())

    async def _stopped_by_filter(
        self, turn: Turn, output: FilteredOutput
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        verdict = output.stopped
        assert verdict is not None
        turn.meter.reason = common_pb2.FINISH_REASON_CONTENT_FILTER
        region_metrics.safety_blocked("output", verdict.categories)
        log.info(
            "turn %s (user %r) stopped by the output filter (%s); %d held tokens withheld",
            turn.prepared.request_id,
            turn.prepared.end_user,
            ",".join(verdict.categories),
            output.held_tokens,
        )
        yield chat_service_pb2.ChatResponse(
            safety=chat_service_pb2.SafetyVerdict(
                stage=chat_service_pb2.SAFETY_STAGE_OUTPUT,
                flagged=True,
                categories=verdict.categories,
                blocked=True,
            )
        )
        async for event in self._end(turn, common_pb2.FINISH_REASON_CONTENT_FILTER):
            yield event

    async def _end(
        self, turn: Turn, reason: common_pb2.FinishReason.ValueType
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        """Record the turn, then send its usage and finish: a follow-up turn
        sent on the finish event finds this one in the conversation."""
        record = self._recorder.start(turn)
        message_id = await asyncio.shield(record)
        meter, model = turn.meter, turn.prepared.model
        usage = meter.usage()
        cost = turn_cost(model, usage.input_tokens, usage.output_tokens)
        yield chat_service_pb2.ChatResponse(
            usage=chat_service_pb2.ChatUsage(usage=usage, cost_usd=format_usd(cost))
        )
        yield chat_service_pb2.ChatResponse(
            finished=chat_service_pb2.ChatFinished(reason=reason, message_id=message_id)
        )

    @staticmethod
    async def _forward_cancel(generation: SessionGeneration, cancel: asyncio.Event) -> None:
        await cancel.wait()
        await generation.cancel("client cancelled")
