"""``EngineService`` over an :class:`engine.backend.EngineBackend`: thin async
handlers that validate, convert and stream; the logic lives in the backend.

``GenerateSession`` (:mod:`engine.session`) carries many generations on
one stream, as a region uses it. Cancellation flows down: a ``cancel``
message or a cancelled call (client gone) aborts the backend request. A
backend ``MeshError`` ends the call with its rich status, also mid-stream:
an engine failure after some tokens ends the stream with UNAVAILABLE
(``ENGINE_FAILED``, RetryInfo) after them.
Feeds (``WatchLoad``, ``StreamKvEvents``) end cleanly when the pod starts
draining, so a drain never waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TypeAlias, TypeVar

import grpc
import grpc.aio

from llmmesh.core.chat_tokenizer import tokenizer_response
from llmmesh.core.errors import InvalidArgument, MeshError, NotFound, Reason
from llmmesh.core.hop_timing import HopStamps
from llmmesh.core.tasks import cancel_and_wait, wait_event
from llmmesh.engine import messages
from llmmesh.engine.backend import EngineBackend, GeneratedTokens, GenerationRequest, GenerationStarted
from llmmesh.engine.hop_metrics import EngineHopMetrics
from llmmesh.engine.session import GenerationSession
from llmmesh.engine.validation import validate_generation, validate_roles
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "llmmesh.v1.EngineService"

Context: TypeAlias = "grpc.aio.ServicerContext[object, object]"
T = TypeVar("T")

CHAT_ROLES = frozenset(common_pb2.ChatRole.values()) - {common_pb2.CHAT_ROLE_UNSPECIFIED}
"""The roles a message may have."""


def _second_start() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_REQUEST,
        "a Generate stream carries one generation; it was stopped at a second start "
        "(GenerateSession carries many)",
        metadata={"param": "start"},
    )


def _no_action() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_REQUEST,
        "a message after the start must hold a cancel; the generation was stopped at one holding no action",
        metadata={"param": "action"},
    )


class EngineServicer(pb_grpc.EngineServiceServicer):
    """Serves one backend. ``load_interval_ms`` is WatchLoad's default interval;
    ``hop_metrics`` gets every generation's way to its first token (a
    session's and a Generate call's alike, so a pod called straight is
    timed as the mesh's calls are)."""

    def __init__(
        self, backend: EngineBackend, load_interval_ms: int, hop_metrics: EngineHopMetrics | None = None
    ) -> None:
        self._backend = backend
        self._load_interval_ms = load_interval_ms
        self._hops = hop_metrics.hops if hop_metrics is not None else None
        self._draining = asyncio.Event()

    def drain(self) -> None:
        """End every feed; generations run on until the server stops."""
        self._draining.set()

    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            # From the call's arrival: a session's turn arrives on a stream already open.
            hops = HopStamps() if self._hops is not None else None
            first = await anext(request_iterator, None)
            if first is None or first.WhichOneof("action") != "start":
                raise InvalidArgument(
                    Reason.INVALID_REQUEST, "the first message must be start", metadata={"param": "start"}
                )
            request = await self._generation_request(first.start)
            if hops is not None:
                hops.stamp("prepare")
        except MeshError as err:
            await err.abort(context)
        pod_id = self._backend.info().pod_id
        refused: list[MeshError] = []
        watcher = asyncio.create_task(self._watch_requests(request_iterator, request.request_id, refused))
        deltas = 0
        try:
            async with contextlib.aclosing(self._backend.generate(request)) as events:
                async for event in events:
                    if isinstance(event, GenerationStarted):
                        if hops is not None:
                            hops.stamp("queue")
                        yield pb.GenerateResponse(started=messages.started(request.request_id, pod_id, event))
                    elif isinstance(event, GeneratedTokens):
                        if hops is not None and self._hops is not None and deltas == 0:
                            hops.stamp("first_token")
                            hops.observe(self._hops)
                        deltas += 1
                        response = pb.GenerateResponse()
                        messages.fill_delta(response.delta, deltas, event)
                        yield response
                    else:
                        yield pb.GenerateResponse(finished=messages.finished(request.request_id, event))
            if refused:
                raise refused[0]
        except MeshError as err:
            await err.abort(context)
        except asyncio.CancelledError:
            # The client went away: free the slot and the blocks now.
            await self._backend.abort(request.request_id)
            raise
        finally:
            await cancel_and_wait(watcher)

    async def GenerateSession(
        self, request_iterator: AsyncIterator[pb.GenerateSessionRequest], context: Context
    ) -> AsyncIterator[pb.GenerateSessionResponse]:
        session = GenerationSession(
            self._backend, self._generation_request, self._backend.info().pod_id, self._hops
        )
        try:
            async with contextlib.aclosing(session.serve(request_iterator)) as responses:
                async for response in responses:
                    yield response
        except MeshError as err:
            await err.abort(context)

    async def CancelGeneration(
        self, request: pb.CancelGenerationRequest, context: Context
    ) -> pb.CancelGenerationResponse:
        try:
            if not request.request_id:
                raise InvalidArgument(
                    Reason.INVALID_REQUEST, "request_id is required", metadata={"param": "request_id"}
                )
            if not await self._backend.abort(request.request_id):
                raise NotFound(
                    Reason.REQUEST_NOT_FOUND,
                    f"no generation {request.request_id!r} runs on this pod",
                    metadata={"param": "request_id"},
                )
        except MeshError as err:
            await err.abort(context)
        log.info("cancel of %s requested: %s", request.request_id, request.reason or "no reason")
        return pb.CancelGenerationResponse()

    async def _generation_request(self, start: pb.GenerateStart) -> GenerationRequest:
        info = self._backend.info()
        self._check_model(start.model)
        if start.messages and start.prompt_token_ids:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "set prompt_token_ids or messages, not both",
                metadata={"param": "messages"},
            )
        prompt_token_ids: list[int] = list(start.prompt_token_ids)
        validate_roles([message.role for message in start.messages], CHAT_ROLES)
        if start.messages:
            _refuse_tool_parts(start.messages)
            if not any(message.content for message in start.messages):
                raise InvalidArgument(
                    Reason.EMPTY_PROMPT, "every message is empty", metadata={"param": "messages"}
                )
            prompt_token_ids = await self._backend.tokenize(messages.chat_turns(start.messages), True)
        request = GenerationRequest(
            request_id=start.request_id,
            prompt_token_ids=tuple(prompt_token_ids),
            sampling=messages.sampling_options(start.sampling),
            priority=start.priority,
            resume_output_token_ids=tuple(start.resume_output_token_ids),
            prefill_only=start.prefill_only,
            kv_transfer=messages.kv_transfer_spec(start.kv_transfer)
            if start.HasField("kv_transfer")
            else None,
        )
        validate_generation(request, info)
        return request

    async def _watch_requests(
        self,
        request_iterator: AsyncIterator[pb.GenerateRequest],
        request_id: str,
        refused: list[MeshError],
    ) -> None:
        """Abort on a cancel message. The stream carries one generation, so a
        cancel stops it whatever request id it names. A second start, or a
        message holding no action, is a caller's mistake, never silently
        dropped: it stops the generation too, and goes in ``refused`` so that
        the call ends refusing it."""
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for message in request_iterator:
                action = message.WhichOneof("action")
                if action == "cancel":
                    log.info("cancel of %s requested: %s", request_id, message.cancel.reason or "no reason")
                else:
                    refused.append(_second_start() if action == "start" else _no_action())
                await self._backend.abort(request_id)
                return

    def _check_model(self, model: str) -> None:
        served = self._backend.info().model
        if model and model != served:
            # Cut short: a status echoing a huge name would outgrow gRPC's metadata limit.
            shown = model if len(model) <= 64 else model[:64] + "..."
            raise NotFound(
                Reason.UNKNOWN_MODEL,
                f"this pod serves {served!r}, not {shown!r}",
                metadata={"param": "model"},
            )

    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        try:
            self._check_model(request.model)
            validate_roles([message.role for message in request.messages], CHAT_ROLES)
            _refuse_tool_parts(request.messages)
            prompt = messages.chat_turns(request.messages) if request.messages else request.text
            token_ids = await self._backend.tokenize(prompt, request.add_generation_prompt)
        except MeshError as err:
            await err.abort(context)
        return pb.TokenizeResponse(token_ids=token_ids)

    async def GetTokenizer(
        self, request: pb.GetTokenizerRequest, context: Context
    ) -> pb.GetTokenizerResponse:
        try:
            self._check_model(request.model)
            model = self._backend.info().model
        except MeshError as err:
            await err.abort(context)
        return tokenizer_response(model, self._backend.tokenizer_spec())

    async def GetEngineInfo(
        self, request: pb.GetEngineInfoRequest, context: Context
    ) -> pb.GetEngineInfoResponse:
        return messages.engine_info_response(self._backend.info())

    async def GetLoad(self, request: pb.GetLoadRequest, context: Context) -> pb.GetLoadResponse:
        return pb.GetLoadResponse(report=self._load_report())

    async def WatchLoad(
        self, request: pb.WatchLoadRequest, context: Context
    ) -> AsyncIterator[pb.WatchLoadResponse]:
        if request.interval_ms < 0:
            await InvalidArgument(
                Reason.INVALID_REQUEST, "interval_ms must not be negative", metadata={"param": "interval_ms"}
            ).abort(context)
        interval_s = (request.interval_ms or self._load_interval_ms) / 1000
        while not self._draining.is_set():
            yield pb.WatchLoadResponse(report=self._load_report())
            await wait_event(self._draining, interval_s)

    async def StreamKvEvents(
        self, request: pb.StreamKvEventsRequest, context: Context
    ) -> AsyncIterator[pb.StreamKvEventsResponse]:
        if request.after_sequence < 0:
            await InvalidArgument(
                Reason.INVALID_REQUEST,
                "after_sequence must not be negative",
                metadata={"param": "after_sequence"},
            ).abort(context)
        info = self._backend.info()
        async for batch in self._until_drained(self._backend.kv_events(request.after_sequence)):
            yield pb.StreamKvEventsResponse(
                pod_id=info.pod_id,
                instance_id=info.instance_id,
                events=[messages.kv_event(event) for event in batch.events],
                gap=batch.gap,
            )

    def _load_report(self) -> pb.LoadReport:
        return messages.load_report(self._backend.info().pod_id, self._backend.load())

    async def _until_drained(self, source: AsyncIterator[T]) -> AsyncIterator[T]:
        """Items of ``source`` until it ends or the pod starts draining."""
        drained = asyncio.ensure_future(self._draining.wait())
        pending: asyncio.Future[T] | None = None
        try:
            while True:
                pending = asyncio.ensure_future(anext(source))
                await asyncio.wait({pending, drained}, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    return
                item, pending = pending, None
                try:
                    value = item.result()
                except StopAsyncIteration:
                    return
                yield value
        finally:
            drained.cancel()
            if pending is not None:
                # Nobody awaits it any more: cancel it and retrieve its outcome,
                # so asyncio does not report an unretrieved exception.
                pending.cancel()
                pending.add_done_callback(_discard_outcome)


def _refuse_tool_parts(chat: Sequence[common_pb2.ChatMessage]) -> None:
    """Raise ``InvalidArgument`` for messages with tool calls or tool results:
    the chat template renders (role, content) only, and the region renders
    tool parts into content itself (``region.turn.prompt_render``), so here they
    would be dropped unseen."""
    if any(message.tool_calls or message.tool_call_id for message in chat):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "a pod renders messages' content only; render tool calls and tool results into "
            "the content or send prompt_token_ids",
            metadata={"param": "messages"},
        )


def _discard_outcome(future: asyncio.Future[T]) -> None:
    if not future.cancelled():
        future.exception()
