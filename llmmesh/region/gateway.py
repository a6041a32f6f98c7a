"""The region gateway: one chat turn from an authenticated start message to
its metered end, across the engine pod that serves it.

A turn goes through, in order: authentication (the cached policy
snapshot), validation, model resolution, the input safety filter (before
any engine work), the context (a conversation's stored history fitted into
the model's window, counted in the engine's tokens), admission (the key's
RPM/TPM limits, the tenant's monthly quota, a slot from the weighted fair
queue), placement by the KV-affinity router, and the engine stream, whose
output passes the streaming safety filter. Whatever was delivered is
recorded with its usage in one zone-store transaction, then billed.

A turn may be the continuation of one whose region failed mid-stream
(``ChatStart.continuation``): its prompt is the original turn's (a
conversation's history leaves out what the original turn stored), the pod
resumes after the tokens the client already has, the output filter is
seeded with their text (a flagged phrase spanning the break is still
caught), deltas are numbered on from the client's last one, and the usage
it reports is the whole turn's: the original prompt once, and all the
output the client received. It is recorded by
:meth:`ZoneStore.record_continuation`, which bills the turn once whichever
region records first.

Request ids and continuations are checked before any engine work: after
admission, the turn is accepted in the zone store (:meth:`ChatGateway._accept`),
which takes its request id once for its tenant (request ids are each
tenant's own: another tenant's turn under the same id is a turn of its own)
and accepts a continuation only of a turn the zone started for the same
tenant and model, once. The turn's first event waits until the store marks it started: a turn
whose id another acceptance took over meanwhile (a retry of a turn that had
streamed nothing) stops before any output.

Tools: the tools a turn offers are rendered into its prompt
(:mod:`region.prompt_render`), so they reach the model and count as input
tokens; its tool messages must answer calls an earlier message (or the
conversation's history) made. A pod's tool-call parts and logprobs go on to
the caller with the delta they came in, each call under the id
:func:`region.tool_calls.tool_call_id` gives it, derived from the turn's
original request id, so a continuation names a call as the first region
did. The output filter reads call arguments as it reads content; their
tokens are output tokens, metered and billed; the reply's calls and the
turn's tool messages are stored with the conversation. A continuation
carries the calls its client has (``Continuation.emitted_tool_calls``):
they seed the filter and complete the stored reply.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Sequence

import grpc
import grpc.aio
from google.protobuf import duration_pb2, timestamp_pb2

from llmmesh.core import tracing
from llmmesh.core.access import require_caller
from llmmesh.core.errors import (
    AlreadyExists,
    InvalidArgument,
    MeshError,
    PermissionDenied,
    Reason,
    Unavailable,
    from_stream_error,
)
from llmmesh.core.identity import Role as PlaneRole
from llmmesh.core.ids import new_id
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.pricing import format_usd
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.v1 import (
    billing_service_pb2,
    chat_service_pb2,
    common_pb2,
    engine_service_pb2,
    model_registry_service_pb2,
    retrieval_service_pb2,
)
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.control import Admission
from llmmesh.region.turn.conversation_context import (
    ConversationContext,
    check_branch_point,
    conversation_context,
    turn_question,
)
from llmmesh.region.modelchoice.difficulty_inputs import quota_budget, stored_history
from llmmesh.region.modelchoice.difficulty_route import FleetPolicy, ModelRouter
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.engine_session import SessionGeneration
from llmmesh.region.admission.fair_queue import engine_priority
from llmmesh.region.turn.filtered_output import FilteredOutput
from llmmesh.region.lifecycle.retry import RecordRetries
from llmmesh.region.lifecycle.spool import SpooledTurn, usage_rows
from llmmesh.region.knowledge.memory import UserMemory
from llmmesh.region.modelchoice.model_policy import require_chat_model, turn_cost
from llmmesh.region.policy_cache import Caller, PolicyCache
from llmmesh.region.admission.ratelimit import Reservation
from llmmesh.region.knowledge.retrieval_context import ChatRetrievalContext
from llmmesh.region.placement.router import KvAffinityRouter
from llmmesh.region.safety import SafetyFilters
from llmmesh.region.settings import RegionSettings
from llmmesh.region.lifecycle.summaries import Summaries
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.region.turn.tool_calls import rewrite_ids
from llmmesh.region.turn.state import PreparedTurn, Turn, TurnMeter
from llmmesh.region.turn.history import input_texts
from llmmesh.region.turn.sampling import fresh_draw
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.turn.validation import validate_start
from llmmesh.region.zone_store.rows import AcceptedTurn, AssistantMessage, ContinuedTurn, Role, TurnRecord, TurnStart
from llmmesh.region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)

_RETRYABLE_BEFORE_OUTPUT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})

# What a queued turn keeps of its caller's deadline for the turn itself.
_DEADLINE_MARGIN_S = 0.1


class _PodFailedEarly(Exception):
    """The pod failed before the turn produced anything: another pod may run it."""


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def rate_limit_status(reservation: Reservation) -> chat_service_pb2.RateLimitStatus:
    """The key's limits as a turn's admission left them, for the edge's ``x-ratelimit-*`` headers."""
    return chat_service_pb2.RateLimitStatus(
        limit_requests=reservation.limit_requests,
        remaining_requests=reservation.remaining_requests,
        reset_requests=_duration(reservation.reset_requests_s),
        limit_tokens=reservation.limit_tokens,
        remaining_tokens=reservation.remaining_tokens,
        reset_tokens=_duration(reservation.reset_tokens_s),
    )


def _duration(seconds: float) -> duration_pb2.Duration:
    span = duration_pb2.Duration()
    span.FromNanoseconds(round(seconds * 1e9))
    return span


class ChatGateway:
    """Authenticates, validates, admits, places and meters chat turns."""

    summaries: Summaries | None = None
    retrieval: ChatRetrievalContext | None = None
    memory: UserMemory | None = None
    """Learns end users' facts and recalls them into their turns, where the
    tenant's policy enables it; set by the region's server."""
    """Puts vector store chunks in the context of turns that ask; set by the
    region's server (None: such a turn is refused)."""
    record_retries: RecordRetries | None = None
    """Retries turn records the zone store refused; set by the region's server
    (None: such a record is only logged)."""
    """Keeps long conversations' summaries; set by the region's server (None:
    history that does not fit is cut, not summarised)."""

    def __init__(
        self,
        settings: RegionSettings,
        policy: PolicyCache,
        models: ModelResolver,
        pool: EnginePool,
        router: KvAffinityRouter,
        tokenizer: TokenizerClient,
        admission: Admission,
        safety: SafetyFilters | None,
        store: ZoneStore,
        shipper: UsageShipper,
        now: Callable[[], timestamp_pb2.Timestamp] = _now,
        *,
        embedding_models: Callable[[], Collection[str]] = tuple,
        model_router: ModelRouter | None = None,
    ) -> None:
        """``embedding_models`` names the models the region's pods embed with
        (:class:`region.embedding_pods.EmbeddingPods`), so a turn on one is refused.
        ``model_router`` chooses each turn's model (``auto`` by difficulty,
        fallbacks); by default one over these pods and the admission's quota."""
        self.model_router = model_router or ModelRouter(
            models,
            pool,
            router.loads,
            quota_budget(admission.quota),
            embedding_models=embedding_models,
            policy=FleetPolicy.of(settings.fallback_queue_factor, settings.named_fallback_tiers),
            history=stored_history(store),
        )
        self._settings = settings
        self._embedding_models = embedding_models
        self._policy = policy
        self._models = models
        self._pool = pool
        self._router = router
        self._tokenizer = tokenizer
        self._admission = admission
        self._safety = safety
        self._store = store
        self._shipper = shipper
        self._now = now
        # Turn records being written; a drain waits for them.
        self._recording: set[asyncio.Task[str]] = set()
        # A turn queued for a slot fails at once when its model's last pod goes.
        pool.on_checked(self._release_turns_without_pods)

    @property
    def admission(self) -> Admission:
        return self._admission

    async def run_turn(
        self,
        start: chat_service_pb2.ChatStart,
        secret: str | None,
        cancel: asyncio.Event,
        deadline_s: float | None = None,
        *,
        allow_continuation: bool = True,
    ) -> AsyncGenerator[chat_service_pb2.ChatResponse, None]:
        """Stream the events of one turn.

        Errors before the first event are raised as MeshError; later ones end
        the stream with an ``error`` event. Whatever was delivered is metered
        once, also when the caller goes away (the generator is closed or
        cancelled). ``deadline_s`` is how long the caller will wait; a turn
        that would queue longer than that is shed at once.
        ``allow_continuation`` says whether the caller may continue a turn
        at all (see :meth:`_accept`).
        """
        arrived_s = time.monotonic()
        caller = self._policy.authenticate(secret)
        validate_start(start, self._settings.max_messages, self._settings.max_message_chars)
        require_continuation_allowed(start, allow_continuation)
        model, route = await self.model_router.choose(start, caller)
        require_chat_model(model, self._pool.models, self._embedding_models())
        if self._safety is not None:
            await self._safety.input_filter.check(input_texts(start))
        # A conversation turn's retrieval excerpts and facts lead its fitted history.
        lead: list[common_pb2.ChatMessage] | None = [] if start.conversation_id else None
        retrieval = await self._retrieve(start, caller, secret, lead)
        if self.memory is not None:
            await self.memory.recall_into(start, caller, lead)
        prepared = await self._prepare_on_a_live_model(caller, model, start, route, lead or ())
        queue_deadline = None if deadline_s is None else max(0.0, deadline_s - _DEADLINE_MARGIN_S)
        admitted = await self._admission.admit(
            caller,
            len(prepared.token_ids) + prepared.max_output_tokens,
            queue_deadline,
            prepared.model.name,
        )
        try:
            holder, accepted = await self._accept(caller, prepared, start)
        except BaseException:
            admitted.release_slot()
            await admitted.settle(0)
            admitted.release_quota()
            raise
        turn = Turn(caller, prepared, admitted, holder, accepted)
        turn.meter.latency = region_metrics.TurnLatency(prepared.model.name, arrived_s)
        if start.HasField("continuation"):
            region_metrics.continuation_accepted()
            turn.meter.carried_tokens = len(start.continuation.emitted_token_ids)
            turn.meter.carried_text = start.continuation.emitted_text
            turn.meter.tool_calls.carry(
                start.continuation.emitted_tool_calls, caller.tenant_id, prepared.original_request_id
            )
        try:
            async for event in self._place_and_stream(turn, start, cancel, route, lead or ()):
                if event.WhichOneof("event") == "started":
                    event.started.route.CopyFrom(route)
                    if retrieval is not None:
                        event.started.retrieval.CopyFrom(retrieval)
                yield event
        except asyncio.CancelledError:
            turn.meter.reason = common_pb2.FINISH_REASON_CANCELLED
            raise
        finally:
            admitted.release_slot()
            if turn.record is None:
                self._start_record(turn)
            if self.memory is not None:
                self.memory.learn_soon(start, caller, prepared.request_id)

    async def _retrieve(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        secret: str | None,
        lead: list[common_pb2.ChatMessage] | None,
    ) -> retrieval_service_pb2.ChatRetrievalReport | None:
        """Excerpts of the vector stores the turn names, put in its messages
        (a conversation turn's: in ``lead``) (:mod:`region.retrieval_context`)."""
        if self.retrieval is not None:
            question = None
            if lead is not None and start.HasField("retrieval"):
                question = await turn_question(self._store, caller.tenant_id, start)
            return await self.retrieval.augment(start, caller, secret, question, lead)
        if start.HasField("retrieval"):
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "this region serves no retrieval",
                metadata={"param": "llmmesh_retrieval"},
            )
        return None

    async def _prepare_on_a_live_model(
        self,
        caller: Caller,
        model: model_registry_service_pb2.Model,
        start: chat_service_pb2.ChatStart,
        route: chat_service_pb2.RouteDecision,
        lead: Sequence[common_pb2.ChatMessage] = (),
    ) -> PreparedTurn:
        """:meth:`_prepare`; when no pod of ``model`` is left to tokenize the
        prompt (pods dead since the last health check, the model's tokenizer
        not yet known here), on the model :meth:`ModelRouter.after_failure`
        gives a turn that may fall back."""
        failed: set[str] = set()
        while True:
            try:
                # Refused before admission: with no pod, a queued turn would wait for nothing.
                no_pod = self._no_pod_left(model.name)
                if no_pod is not None:
                    raise no_pod
                return await self._prepare(caller, model, start, lead)
            except Unavailable as error:
                if error.reason != Reason.ENGINE_UNAVAILABLE:
                    raise
                other = await self.model_router.after_failure(start, caller, model, failed, route)
                failed.add(model.name)
                if other is None:
                    raise
                model = other

    def _release_turns_without_pods(self) -> None:
        released = self._admission.refuse_waiting(self._no_pod_left)
        if released:
            log.warning("%d queued turns released: their model has no healthy engine pod left", released)

    def _no_pod_left(self, model: str) -> Unavailable | None:
        """UNAVAILABLE (ENGINE_UNAVAILABLE, with RetryInfo) when no healthy
        pod here serves ``model``; None when one does (or no model is named)."""
        if not model or any(not p.model or p.model == model for p in self._pool.healthy_pods):
            return None
        return Unavailable(
            Reason.ENGINE_UNAVAILABLE,
            f"no healthy engine pod serves model {model!r} in this region",
            retry_after_s=1.0,
        )

    async def _prepare(
        self,
        caller: Caller,
        model: model_registry_service_pb2.Model,
        start: chat_service_pb2.ChatStart,
        lead: Sequence[common_pb2.ChatMessage] = (),
    ) -> PreparedTurn:
        """The engine's view of the turn: a conversation's history fitted into
        the window after its system messages and ``lead``, the prompt tokens
        as the engine counts them."""
        request_id = start.request_id or new_id("req")
        fresh_draw(start, request_id)
        window = self._pool.context_window(model.name)
        sampling = start.sampling
        # Tool definitions are prompt text: rendered into it, counted with it.
        tools = tuple(sampling.tools)
        requested = sampling.max_tokens if sampling.HasField("max_tokens") else None
        messages: Sequence[common_pb2.ChatMessage] = start.messages
        context: ConversationContext | None = None
        continues = start.continuation.original_request_id if start.HasField("continuation") else ""
        check_branch_point(start)
        if start.conversation_id:

            async def count(candidate: Sequence[common_pb2.ChatMessage]) -> int:
                return len(await self._tokenizer.tokenize(model.name, candidate, tools=tools))

            context = await conversation_context(
                self._store,
                caller.tenant_id,
                start,
                continues=continues,
                window_tokens=window,
                # Without max_tokens, history leaves a reply room to be useful.
                reserve_output_tokens=requested or min(self._settings.default_output_tokens, window // 4),
                count_tokens=count,
                summaries=self.summaries,
                lead=lead,
            )
            messages = context.messages
        token_ids = await self._tokenizer.tokenize(model.name, messages, tools=tools)
        if window and len(token_ids) + (requested or 1) > window:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"the prompt has {len(token_ids)} tokens and max_tokens asks for {requested or 1} more; "
                f"model {model.name} has a context window of {window} tokens",
                metadata={"param": "messages"},
            )
        room = window - len(token_ids) if window else requested or self._settings.default_output_tokens
        max_output = requested or min(self._settings.default_output_tokens, room)
        return PreparedTurn(
            request_id,
            model,
            tuple(messages),
            token_ids,
            max_output,
            context.conversation_id if context else None,
            context.user_text if context else None,
            continues or None,
            context.tool_results if context else (),
            start.user,
            context,
        )

    async def _accept(
        self,
        caller: Caller,
        prepared: PreparedTurn,
        start: chat_service_pb2.ChatStart,
    ) -> tuple[str, AcceptedTurn]:
        """The gate every turn passes before any engine work: the zone store
        takes its request id (once per tenant: ids are each tenant's own) and, for a
        continuation (from a caller :func:`require_continuation_allowed`
        let through), vouches for the turn it continues: started by this
        tenant, with this model, not continued before, and carrying no more
        tokens than it could produce.

        Returns this acceptance's holder token and what the store knew.
        """
        holder = secrets.token_hex(8)
        start_marker = TurnStart(
            request_id=prepared.request_id,
            tenant_id=caller.tenant_id,
            model=prepared.model.name,
            prompt_tokens=len(prepared.token_ids),
            max_output_tokens=prepared.max_output_tokens,
            holder=holder,
            continues=prepared.continues,
            carried_tokens=len(start.continuation.emitted_token_ids),
        )
        try:
            accepted = await self._store.accept_turn(start_marker)
        except MeshError:
            raise
        except Exception as err:
            # A turn the zone store cannot vouch for is not run: it could not be billed either.
            log.exception("turn %s: the zone store could not accept it", prepared.request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot accept turns now", retry_after_s=1.0
            ) from err
        return holder, accepted

    async def _hold_request_id(self, turn: Turn) -> None:
        """Mark the turn started before its first event goes out; ALREADY_EXISTS
        when another acceptance took its request id over meanwhile."""
        request_id = turn.prepared.request_id
        try:
            held = await self._store.mark_started(turn.caller.tenant_id, request_id, turn.holder)
        except Exception as err:
            log.exception("turn %s: the zone store could not mark it started", request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot accept turns now", retry_after_s=1.0
            ) from err
        if not held:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request id {request_id!r} was taken over by a retry of the turn",
                metadata={"request_id": request_id},
            )

    async def _place_and_stream(
        self,
        turn: Turn,
        start: chat_service_pb2.ChatStart,
        cancel: asyncio.Event,
        route: chat_service_pb2.RouteDecision,
        lead: Sequence[common_pb2.ChatMessage] = (),
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        resume = tuple(start.continuation.emitted_token_ids)
        tried: set[str] = set()
        failed_models: set[str] = set()
        while True:
            prepared = turn.prepared
            try:
                decision = await self._router.choose(
                    prepared.model.name, [*prepared.token_ids, *resume], exclude=tried
                )
            except Unavailable as error:
                # No pod of the model is left here: another model may take the turn.
                if not await self._move_to_another_model(turn, start, route, failed_models, lead):
                    raise error from None
                tried.clear()
                continue
            pod = decision.pod
            region_metrics.routed(
                prepared.model.name,
                decision.policy.value,
                pod.pod_id,
                len(prepared.token_ids),
                decision.resident_tokens,
            )
            try:
                async for event in self._run_on_pod(pod, start, turn, cancel):
                    yield event
                return
            except _PodFailedEarly:
                tried.add(pod.address)
                self._pool.mark_failed(pod)
                log.warning(
                    "turn %s: pod %s failed before output; trying another", prepared.request_id, pod.pod_id
                )

    async def _move_to_another_model(
        self,
        turn: Turn,
        start: chat_service_pb2.ChatStart,
        route: chat_service_pb2.RouteDecision,
        failed_models: set[str],
        lead: Sequence[common_pb2.ChatMessage] = (),
    ) -> bool:
        """Give a turn whose model has no pod left here before its first
        event to another model of this region, when the turn may fall back
        (:meth:`ModelRouter.after_failure`): prepared for that model with the
        same ``lead`` (a conversation turn's excerpts and facts) and accepted
        again under the same request id (taking over the acceptance that
        streamed nothing). False when it stays put."""
        failed = turn.prepared.model
        model = await self.model_router.after_failure(start, turn.caller, failed, failed_models, route)
        failed_models.add(failed.name)
        if model is None:
            return False
        again = chat_service_pb2.ChatStart()
        again.CopyFrom(start)
        again.request_id = turn.prepared.request_id
        try:
            prepared = await self._prepare(turn.caller, model, again, lead)
            turn.holder, turn.accepted = await self._accept(turn.caller, prepared, again)
        except MeshError as error:
            log.warning("turn %s cannot fall back to %s: %s", again.request_id, model.name, error.message)
            return False
        turn.prepared = prepared
        arrived_s = turn.meter.latency.arrived_s if turn.meter.latency else time.monotonic()
        turn.meter.latency = region_metrics.TurnLatency(model.name, arrived_s)
        return True

    async def _run_on_pod(
        self,
        pod: EnginePodHandle,
        start: chat_service_pb2.ChatStart,
        turn: Turn,
        cancel: asyncio.Event,
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        prepared, meter = turn.prepared, turn.meter
        base_sequence = start.continuation.last_sequence if start.HasField("continuation") else 0
        output = FilteredOutput(self._safety.new_output_filter() if self._safety is not None else None)
        await output.seed(meter.carried_text + meter.tool_calls.text())
        # Counted before the first await: the router reads it for the next turn.
        pod.in_flight += 1
        generation: SessionGeneration | None = None
        forward: asyncio.Task[None] | None = None
        produced = False
        engine_request_id = generation_id(prepared.request_id, turn.holder)
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
                        resume_output_token_ids=start.continuation.emitted_token_ids,
                        trace_context=tracing.trace_context_message(),
                    )
                ),
            )
            forward = asyncio.create_task(self._forward_cancel(generation, cancel))
            async for resp in generation:
                kind = resp.WhichOneof("event")
                if kind == "started":
                    # Counted even if the id was lost: the prompt was prefilled.
                    meter.prompt(resp.started.prompt_tokens, resp.started.cached_prompt_tokens)
                    await self._hold_request_id(turn)
                    produced = meter.started = True
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
                    # Ids of the region's own, the same in every region that serves the turn.
                    calls = rewrite_ids(delta.tool_calls, turn.caller.tenant_id, prepared.original_request_id)
                    release = await output.feed(
                        delta.text, tuple(delta.token_ids), tuple(calls), tuple(delta.logprobs)
                    )
                    if release:
                        yield meter.deliver(base_sequence, release)
                    elif output.stopped is not None:
                        break
                elif kind == "error":
                    raise from_stream_error(resp.error)
                elif kind == "finished":
                    finished = resp.finished
                    if finished.HasField("usage"):
                        meter.prompt(
                            finished.usage.input_tokens or meter.input_tokens + meter.carried_tokens,
                            finished.usage.cached_input_tokens,
                        )
                    release = await output.finish()
                    if release:
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
            if not produced and error.code in _RETRYABLE_BEFORE_OUTPUT and not cancel.is_set():
                raise _PodFailedEarly from error
            if error.code == grpc.StatusCode.UNAVAILABLE and error.reason != Reason.ENGINE_FAILED:
                error = Unavailable(
                    Reason.ENGINE_FAILED,
                    f"engine pod {pod.pod_id} failed mid-stream: {error.message}",
                    retry_after_s=1.0,
                )
            if not produced:
                raise error from None
            meter.reason = common_pb2.FINISH_REASON_ERROR
            region_metrics.turn_failed(error)
            yield chat_service_pb2.ChatResponse(error=error.to_stream_error())
        finally:
            pod.in_flight -= 1
            await cancel_and_wait(forward)
            if generation is not None:
                # The pod aborts a generation its turn stopped reading.
                generation.abandon("the turn stopped reading")

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
        record = self._start_record(turn)
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

    async def drain(self, retry_grace_s: float = 5.0) -> None:
        """Wait for the turn records still being written, and up to
        ``retry_grace_s`` for those being retried."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)
        if self.record_retries is not None:
            await self.record_retries.drain(retry_grace_s)

    def _start_record(self, turn: Turn) -> asyncio.Task[str]:
        """Record the turn in its own task: a caller that goes away cancels
        the stream, never the write of what it was billed for."""
        if turn.record is None:
            turn.record = asyncio.create_task(self._record_turn(turn))
            self._recording.add(turn.record)
            turn.record.add_done_callback(self._recording.discard)
        return turn.record

    async def _record_turn(self, turn: Turn) -> str:
        """Write the reply and its usage row in one zone-store transaction,
        then settle the rate limit and quota and let the shipper bill it.
        Returns the stored assistant message's id ("" when none was stored)."""
        caller, prepared, meter, admitted = turn.caller, turn.prepared, turn.meter, turn.admitted
        message_id = ""
        try:
            if meter.started:
                attributes = {"llmmesh.plane": "region", "db.operation.name": "record_turn"}
                with tracing.span("zone store write", attributes=attributes):
                    message_id = await self._write_record(caller, prepared, meter)
        finally:
            # A continuation's prompt was counted, as far as the original's went, where the turn began.
            prompt = max(0, meter.input_tokens - turn.accepted.counted_prompt_tokens)
            await admitted.settle(prompt + meter.output_tokens)
            region_metrics.turn_ended(
                prepared.model.name,
                caller.tenant_id,
                meter.reason,
                prompt,
                meter.output_tokens,
                meter.cached_input_tokens,
            )
            admitted.release_quota()
        return message_id

    async def _write_record(self, caller: Caller, prepared: PreparedTurn, meter: TurnMeter) -> str:
        model = prepared.model
        reason = meter.reason or common_pb2.FINISH_REASON_CANCELLED
        whole = meter.usage()

        # The region that records a row ships it, and billing takes a
        # region's records only in its own name: a continued turn's
        # original row, written here, is this region's too.
        template = billing_service_pb2.UsageRecord(
            request_id=prepared.request_id,
            tenant_id=caller.tenant_id,
            model=model.name,
            region=self._settings.region,
            usage=common_pb2.TokenUsage(
                input_tokens=meter.input_tokens,
                output_tokens=meter.output_tokens,
                cached_input_tokens=meter.cached_input_tokens,
            ),
            finish_reason=reason,
            end_time=self._now(),
            end_user=prepared.end_user,
        ).SerializeToString()

        assistant = AssistantMessage(
            content=meter.reply_text(),
            model=model.name,
            finish_reason=common_pb2.FinishReason.Name(reason),
            input_tokens=whole.input_tokens,
            output_tokens=whole.output_tokens,
            cached_input_tokens=whole.cached_input_tokens,
            cost_usd=turn_cost(model, whole.input_tokens, whole.output_tokens),
            tool_calls=meter.reply_tool_calls(),
        )
        # The record is made from these values alone, so a region restart can retry it.
        continued = None
        if prepared.continues is not None:
            continued = ContinuedTurn(
                prepared.continues, meter.input_tokens, meter.carried_tokens, meter.carried_text
            )
        # A turn of its own has its one usage row; a continuation, the template of its rows.
        usage = template
        if continued is None:
            usage = usage_rows(template)(prepared.request_id, meter.input_tokens, meter.output_tokens, "")
        spooled = SpooledTurn(
            caller.tenant_id,
            prepared.conversation_id,
            prepared.request_id,
            prepared.user_text,
            assistant,
            usage,
            meter.input_tokens + meter.output_tokens,
            prepared.tool_results,
            prepared.parent_id,
            continued,
            meter.output_tokens,
        )

        async def write() -> TurnRecord:
            return await spooled.write(self._store)

        try:
            record = await write()
        except MeshError:
            # The store refused the record itself (a request id taken elsewhere): no retry can help.
            log.exception(
                "turn %s (tenant %s, user %r): its usage could not be recorded",
                prepared.request_id,
                caller.tenant_id,
                prepared.end_user,
            )
            return ""
        except Exception:
            # The store failed: the tokens were delivered, so the record is kept and written when it can be.
            log.exception(
                "turn %s (tenant %s): writing its record failed; retrying",
                prepared.request_id,
                caller.tenant_id,
            )
            if self.record_retries is None:
                return ""
            self.record_retries.keep(prepared.request_id, write, spooled)
            return ""
        self._shipper.notify()
        # The end user, as OpenAI's `user` asks, for abuse tracking in the region's log.
        log.info(
            "turn %s: tenant %s, user %r, %s, %d input and %d output tokens",
            prepared.request_id,
            caller.tenant_id,
            prepared.end_user,
            common_pb2.FinishReason.Name(reason),
            whole.input_tokens,
            whole.output_tokens,
        )
        return next((m.id for m in record.messages if m.role == Role.ASSISTANT), "")


def generation_id(request_id: str, holder: str) -> str:
    """The id of a turn's generation on a pod. Request ids are each tenant's
    own, so two tenants' turns of one id may run on one pod at once; this
    acceptance's holder (a fixed-length random token) tells them apart."""
    return f"{request_id}.{holder}"


def require_continuation_allowed(start: chat_service_pb2.ChatStart, allow_continuation: bool) -> None:
    """Whether this caller may send a continuation at all, decided before any
    work: a continuation's carried tokens become the reply's beginning, so
    only a caller trusted to report what a client received (an edge) may
    send one. PERMISSION_DENIED otherwise."""
    if not start.HasField("continuation"):
        return
    if not allow_continuation:
        raise PermissionDenied(
            Reason.PEER_NOT_ALLOWED,
            "this caller may not continue a turn",
            metadata={"param": "continuation"},
        )
    # On a secured region, only the edge's certificate vouches for what a client received.
    require_caller((PlaneRole.EDGE,), "continue a failed-over turn")
