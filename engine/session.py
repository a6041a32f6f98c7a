"""``GenerateSession``: many generations on one long-lived stream, the
events of a decode step sent together.

Each start runs its generation in a task of its own. The tasks put their
events in one :class:`~llmmesh.outbox.Outbox`, and the stream sends all it
holds as one message each time it wakes. The backend hands a step's tokens
to every generation of the batch at once, so all of them are in the outbox
before the sender runs: one message per step for the batch, not one per
generation and step.

A generation's failure (validation, the backend's MeshError) is an
``error`` event of that generation; the stream stays up for the others.
When the client half-closes, the stream ends once its generations have; a
cancelled stream aborts every generation still running on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import grpc.aio

from engine import messages
from engine.backend import EngineBackend, GeneratedTokens, GenerationRequest, GenerationStarted
from llmmesh.errors import AlreadyExists, Internal, InvalidArgument, MeshError, Reason
from llmmesh.outbox import Outbox
from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import engine_service_pb2 as pb

log = logging.getLogger(__name__)

Prepare = Callable[[pb.GenerateStart], Awaitable[GenerationRequest]]


class GenerationSession:
    """One ``GenerateSession`` call: ``prepare`` turns a start message into a
    validated request (raising MeshError); ``pod_id`` names the pod in
    ``started`` events."""

    def __init__(self, backend: EngineBackend, prepare: Prepare, pod_id: str) -> None:
        self._backend = backend
        self._prepare = prepare
        self._pod_id = pod_id
        self._outbox: Outbox[pb.GenerationEvent] = Outbox()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._half_closed = False

    async def serve(
        self, requests: AsyncIterator[pb.GenerateSessionRequest]
    ) -> AsyncGenerator[pb.GenerateSessionResponse, None]:
        """The stream's messages out, until the client has half-closed and
        every generation has ended."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if batch := await self._outbox.take():
                    yield pb.GenerateSessionResponse(events=batch)
                if self._half_closed and not self._running:
                    return
        finally:
            await cancel_and_wait(reader)
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[pb.GenerateSessionRequest]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for request in requests:
                action = request.WhichOneof("action")
                if action == "start":
                    self._begin(request.start)
                elif action == "cancel":
                    await self._cancel(request.cancel)
        self._half_closed = True
        self._outbox.poke()

    def _begin(self, start: pb.GenerateStart) -> None:
        request_id = start.request_id
        if not request_id:
            self._emit(
                pb.GenerationEvent(
                    error=InvalidArgument(
                        Reason.INVALID_REQUEST,
                        "request_id is required on a session",
                        metadata={"param": "request_id"},
                    ).to_stream_error()
                )
            )
        elif request_id in self._running:
            self._emit(
                pb.GenerationEvent(
                    request_id=request_id,
                    error=AlreadyExists(
                        Reason.DUPLICATE_REQUEST,
                        f"generation {request_id!r} already runs on this session",
                        metadata={"param": "request_id"},
                    ).to_stream_error(),
                )
            )
        else:
            self._running[request_id] = asyncio.create_task(self._run(start), name=f"session-{request_id}")

    async def _cancel(self, cancel: pb.GenerateCancel) -> None:
        if cancel.request_id in self._running:
            log.info("cancel of %s requested: %s", cancel.request_id, cancel.reason or "no reason")
            await self._backend.abort(cancel.request_id)

    async def _run(self, start: pb.GenerateStart) -> None:
        request_id = start.request_id
        deltas = 0
        try:
            request = await self._prepare(start)
            async with contextlib.aclosing(self._backend.generate(request)) as events:
                async for event in events:
                    if isinstance(event, GenerationStarted):
                        started = messages.started(request_id, self._pod_id, event)
                        self._emit(pb.GenerationEvent(request_id=request_id, started=started))
                    elif isinstance(event, GeneratedTokens):
                        deltas += 1
                        delta = messages.delta(deltas, event)
                        self._emit(pb.GenerationEvent(request_id=request_id, delta=delta))
                    else:
                        finished = messages.finished(request_id, event)
                        self._emit(pb.GenerationEvent(request_id=request_id, finished=finished))
        except MeshError as err:
            self._emit(pb.GenerationEvent(request_id=request_id, error=err.to_stream_error()))
        except asyncio.CancelledError:
            # The session ended under it: free the slot and the blocks now.
            await self._backend.abort(request_id)
            raise
        except Exception:
            log.exception("generation %s failed", request_id)
            error = Internal(Reason.ENGINE_FAILED, "the generation failed in the pod")
            self._emit(pb.GenerationEvent(request_id=request_id, error=error.to_stream_error()))
        finally:
            del self._running[request_id]
            self._outbox.poke()

    def _emit(self, event: pb.GenerationEvent) -> None:
        self._outbox.put(event)
