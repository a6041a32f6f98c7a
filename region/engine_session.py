"""The region's side of a pod's ``GenerateSession``: one long-lived stream
per pod that every turn placed on the pod shares.

A turn costs one message out (its start) instead of a call set-up, and the
pod sends one message per decode step for all its generations; a reader
task hands each event to its generation's queue. A generation's queue
holds at most its reply's events, so a slow turn holds up no other.

When the stream breaks (the pod died, the connection reset), every
generation on it ends with UNAVAILABLE ``ENGINE_FAILED``, and the next turn
opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
import grpc.aio

from llmmesh.errors import MeshError, Reason, Unavailable, from_stream_error
from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

log = logging.getLogger(__name__)

SessionCall: TypeAlias = grpc.aio.StreamStreamCall
_WRITE_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


class SessionGeneration:
    """One generation on a session: its events in order, ending after
    ``finished``; an ``error`` event (the pod's) or a broken session raises
    its MeshError."""

    def __init__(self, session: EngineSession, request_id: str) -> None:
        self.request_id = request_id
        self._session = session
        self._events: asyncio.Queue[engine_service_pb2.GenerationEvent | MeshError] = asyncio.Queue()
        self.ended = False

    def _push(self, event: engine_service_pb2.GenerationEvent | MeshError) -> None:
        self._events.put_nowait(event)

    async def __aiter__(self) -> AsyncIterator[engine_service_pb2.GenerationEvent]:
        while not self.ended:
            event = await self._events.get()
            if isinstance(event, MeshError):
                self.ended = True
                raise event
            kind = event.WhichOneof("event")
            if kind == "error":
                self.ended = True
                raise from_stream_error(event.error)
            self.ended = kind == "finished"
            yield event

    async def cancel(self, reason: str) -> None:
        """Ask the pod to stop the generation; it then finishes as cancelled."""
        await self._session.write(
            engine_service_pb2.GenerateSessionRequest(
                cancel=engine_service_pb2.GenerateCancel(request_id=self.request_id, reason=reason)
            )
        )

    def abandon(self) -> None:
        """The caller stops reading: forget the generation and, unless it
        ended, have the pod abort it."""
        self._session.forget(self, abort=not self.ended)


class EngineSession:
    """The session stream of one pod, opened on first use and again after
    it broke. ``pod_name`` is for messages."""

    def __init__(self, stub: engine_service_pb2_grpc.EngineServiceStub, pod_name: str) -> None:
        self._stub = stub
        self._pod_name = pod_name
        self._call: SessionCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self._generations: dict[str, SessionGeneration] = {}
        self._write_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def generations(self) -> int:
        """Generations running on the session now."""
        return len(self._generations)

    async def start(self, start: engine_service_pb2.GenerateStart) -> SessionGeneration:
        """Start a generation (its ``request_id`` unique among the running
        ones); its events follow on the returned generation. Raises
        Unavailable when the pod cannot be reached."""
        if start.request_id in self._generations:
            raise RuntimeError(f"generation {start.request_id!r} already runs on this session")
        generation = SessionGeneration(self, start.request_id)
        self._generations[start.request_id] = generation
        if self._call is None:
            self._open()
        await self.write(engine_service_pb2.GenerateSessionRequest(start=start))
        return generation

    async def write(self, request: engine_service_pb2.GenerateSessionRequest) -> None:
        """Send one message; a failed write is the stream's failure, which
        its reader reports to every generation."""
        call = self._call
        if call is None:
            return
        async with self._write_lock:
            try:
                await call.write(request)
            except _WRITE_ERRORS as err:
                log.debug("write to the session of %s failed: %s", self._pod_name, err)

    def forget(self, generation: SessionGeneration, abort: bool) -> None:
        if self._generations.get(generation.request_id) is not generation:
            return
        del self._generations[generation.request_id]
        if abort and self._call is not None:
            request = engine_service_pb2.GenerateSessionRequest(
                cancel=engine_service_pb2.GenerateCancel(
                    request_id=generation.request_id, reason="the region stopped reading"
                )
            )
            task = asyncio.create_task(self.write(request))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _open(self) -> None:
        call: SessionCall = self._stub.GenerateSession()
        self._call = call
        self._reader = asyncio.create_task(self._read(call), name=f"session-{self._pod_name}")

    async def _read(self, call: SessionCall) -> None:
        failure: MeshError
        try:
            async for response in call:
                for event in response.events:
                    generation = self._generations.get(event.request_id)
                    if generation is None:
                        continue  # abandoned by its turn
                    generation._push(event)
                    if event.WhichOneof("event") in ("finished", "error"):
                        del self._generations[event.request_id]
            failure = Unavailable(
                Reason.ENGINE_FAILED, f"engine pod {self._pod_name} ended its session", retry_after_s=1.0
            )
        except grpc.aio.AioRpcError as err:
            failure = Unavailable(
                Reason.ENGINE_FAILED,
                f"engine pod {self._pod_name} failed ({err.code().name}: {err.details()})",
                retry_after_s=1.0,
            )
        if self._call is call:
            self._call = None
        generations, self._generations = self._generations, {}
        for generation in generations.values():
            generation._push(failure)
        if generations:
            log.warning("%s; %d generations on it failed", failure.message, len(generations))

    async def close(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        await cancel_and_wait(self._reader)
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError):
                await cancel_and_wait(task)
