"""``GenerateSession``: many generations on one long-lived stream, the
events of a decode step sent together.

The backend hands a step's tokens to every generation of the batch at
once, so all of them are in the session's outbox before the sender runs:
one message per step for the batch, not one per generation and step (see
:mod:`llmmesh.core.session_server` for the stream's rules). A generation's
failure (validation, the backend's MeshError) is an ``error`` event of that
generation; a cancelled stream aborts every generation still running on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from opentelemetry.trace import Span, SpanKind
from prometheus_client import Histogram

from llmmesh.core import tracing
from llmmesh.core.errors import Internal, MeshError, Reason
from llmmesh.core.genai_spans import chat_attributes, record_finish, record_usage
from llmmesh.core.hop_timing import HopStamps
from llmmesh.core.json_logs import bind_request_id
from llmmesh.core.session_server import SessionServer
from llmmesh.engine import messages
from llmmesh.engine.backend import EngineBackend, GeneratedTokens, GenerationRequest, GenerationStarted
from llmmesh.v1 import engine_service_pb2 as pb

log = logging.getLogger(__name__)

Prepare = Callable[[pb.GenerateStart], Awaitable[GenerationRequest]]


class GenerationSession(SessionServer[pb.GenerateStart, pb.GenerationEvent, pb.GenerateSessionResponse]):
    """One ``GenerateSession`` call: ``prepare`` turns a start message into a
    validated request (raising MeshError); ``pod_id`` names the pod in
    ``started`` events; ``hops`` (when given) gets each generation's way
    to its first token (:mod:`llmmesh.engine.hop_metrics`)."""

    kind = "generation"
    internal = Internal(Reason.ENGINE_FAILED, "the generation failed in the pod")

    def __init__(
        self, backend: EngineBackend, prepare: Prepare, pod_id: str, hops: Histogram | None = None
    ) -> None:
        super().__init__()
        self._backend = backend
        self._prepare = prepare
        self._pod_id = pod_id
        self._hops = hops

    def request_id(self, start: pb.GenerateStart) -> str:
        return start.request_id

    def error_event(self, request_id: str, error: MeshError) -> pb.GenerationEvent:
        return pb.GenerationEvent(request_id=request_id, error=error.to_stream_error())

    def response(self, events: list[pb.GenerationEvent]) -> pb.GenerateSessionResponse:
        response = pb.GenerateSessionResponse()
        response.events.extend(events)
        return response

    async def cancel(self, request_id: str, reason: str) -> None:
        log.info("cancel of %s requested: %s", request_id, reason)
        await self._backend.abort(request_id)

    async def run(self, request_id: str, start: pb.GenerateStart) -> None:
        bind_request_id(request_id)
        parent = tracing.context_of_message(start.trace_context) if tracing.enabled() else None
        attributes = chat_attributes(start.model, plane="engine", pod_id=self._pod_id, request_id=request_id)
        with tracing.span(
            f"generate {start.model}", kind=SpanKind.SERVER, parent=parent, attributes=attributes
        ) as span:
            await self._generate(request_id, start, span)

    async def _generate(self, request_id: str, start: pb.GenerateStart, span: Span) -> None:
        deltas = 0
        hops = HopStamps() if self._hops is not None else None
        try:
            request = await self._prepare(start)
            if hops is not None:
                hops.stamp("prepare")
            async with contextlib.aclosing(self._backend.generate(request)) as events:
                async for event in events:
                    if isinstance(event, GenerationStarted):
                        if hops is not None:
                            hops.stamp("queue")
                        started = messages.started(request_id, self._pod_id, event)
                        self.outbox.put(pb.GenerationEvent(request_id=request_id, started=started))
                    elif isinstance(event, GeneratedTokens):
                        if hops is not None and self._hops is not None and deltas == 0:
                            hops.stamp("first_token")
                            hops.observe(self._hops)
                        deltas += 1
                        generation_event = pb.GenerationEvent(request_id=request_id)
                        messages.fill_delta(generation_event.delta, deltas, event)
                        self.outbox.put(generation_event)
                    else:
                        finished = messages.finished(request_id, event)
                        if span.is_recording():
                            record_usage(span, finished.usage)
                            record_finish(span, finished.reason)
                        self.outbox.put(pb.GenerationEvent(request_id=request_id, finished=finished))
        except asyncio.CancelledError:
            # The session ended under it: free the slot and the blocks now.
            await self._backend.abort(request_id)
            raise
