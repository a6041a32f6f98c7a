"""The server side of a session stream: many requests (generations, turns)
on one long-lived gRPC stream, each named by its request id, their events
sent together.

Each start runs its request in a task of its own. The tasks put their
events in one :class:`~llmmesh.outbox.Outbox`, and the stream sends all it
holds as one message each time it wakes, so a decode step that reaches
every request of a batch at once goes out as one message.

A request's failure is an event of that request; the stream stays up for
the others. A client message may hold several starts (``starts``), taken
in order as that many start messages would be. One that holds no action,
or ``starts`` without a start (a client speaking a newer contract, or a
broken one), is never skipped: the stream ends with INVALID_ARGUMENT, its
running requests cancelled. Nor is
a cancel: one naming a request that runs stops it; one naming a request
that ended on the stream (the cancel crossed its last events) has nothing
left to stop; one naming a request the stream never ran (or no request) is
refused with that request's error event (NOT_FOUND ``REQUEST_NOT_FOUND``,
or INVALID_ARGUMENT without an id), the stream going on. When
the client half-closes (or the server stops taking requests), the stream
ends once its requests have; a cancelled stream cancels every request
still running on it. Subclasses say how a request
runs and how its events and errors are shaped: ``engine/session.py`` for
``EngineService.GenerateSession``, ``region/chat_session.py`` for
``ChatService.ChatSession``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Generic, TypeVar

import grpc.aio

from llmmesh.core.errors import AlreadyExists, InvalidArgument, MeshError, NotFound, Reason
from llmmesh.core.outbox import Outbox
from llmmesh.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

ENDED_KEPT = 4096
"""How many ended requests a stream remembers, to tell a cancel that crossed
a request's end from one naming a request it never ran."""

Start = TypeVar("Start")
Event = TypeVar("Event")
Response = TypeVar("Response")


class SessionServer(ABC, Generic[Start, Event, Response]):
    """One session call. ``kind`` names a request in error messages
    ("generation", "turn"); ``internal`` is the error a request gets when
    it fails unexpectedly."""

    kind: str
    internal: MeshError

    def __init__(self) -> None:
        self.outbox: Outbox[Event] = Outbox()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._half_closed = False
        self._refused: MeshError | None = None

    @abstractmethod
    def request_id(self, start: Start) -> str:
        """The id a start message names its request by."""

    @abstractmethod
    async def run(self, request_id: str, start: Start) -> None:
        """Run one request, putting its events in the outbox. A MeshError
        it raises becomes the request's error event."""

    @abstractmethod
    async def cancel(self, request_id: str, reason: str) -> None:
        """The client asked to stop a running request."""

    @abstractmethod
    def error_event(self, request_id: str, error: MeshError) -> Event:
        """The event that ends a request with ``error``."""

    def cancel_refused(self, request_id: str, error: MeshError) -> Event:
        """The event that refuses a cancel naming no request the stream ran
        (``request_id`` is not one of its requests: none failed)."""
        return self.error_event(request_id, error)

    @abstractmethod
    def response(self, events: list[Event]) -> Response:
        """One message out carrying ``events``."""

    def refusal(self, request_id: str) -> MeshError | None:
        """Why a new request is refused before it runs; None to run it."""
        return None

    def stopping(self) -> bool:
        """The server takes no more requests: end the stream once the
        running ones have."""
        return False

    def closed(self) -> None:
        """The stream ended."""

    def wake(self) -> None:
        """Have the stream look at ``stopping`` now."""
        self.outbox.poke()

    async def serve(self, requests: AsyncIterator[Any]) -> AsyncGenerator[Response, None]:
        """The stream's messages out, until the client has half-closed (or
        the server is stopping) and every request has ended. Raises
        InvalidArgument once the client sent a message holding no action."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if batch := await self.outbox.take():
                    yield self.response(batch)
                if self._refused is not None:
                    raise self._refused
                # A request may end (its last events put, itself gone from
                # ``_running``) while the message before was being sent:
                # those events go out before the stream ends.
                if (self._half_closed or self.stopping()) and not self._running and not self.outbox.pending:
                    return
        finally:
            self.closed()
            await cancel_and_wait(reader)
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for request in requests:
                action = request.WhichOneof("action")
                if action == "start":
                    self._begin(request.start)
                elif action == "cancel":
                    await self._stop(request.cancel.request_id, request.cancel.reason)
                elif action == "starts" and request.starts.starts:
                    for start in request.starts.starts:
                        self._begin(start)
                else:
                    self._refused = InvalidArgument(
                        Reason.INVALID_REQUEST,
                        "a session message must hold a start, starts (at least one) or a cancel",
                        metadata={"param": "action"},
                    )
                    break
        self._half_closed = True
        self.outbox.poke()

    async def _stop(self, request_id: str, reason: str) -> None:
        if request_id in self._running:
            await self.cancel(request_id, reason or "no reason given")
        elif request_id in self._ended:
            log.debug("cancel of %s %s after it ended: nothing left to stop", self.kind, request_id)
        else:
            error: MeshError = (
                _no_request_id()
                if not request_id
                else NotFound(
                    Reason.REQUEST_NOT_FOUND,
                    f"no {self.kind} {request_id!r} ran on this session: nothing to cancel",
                    metadata={"param": "request_id"},
                )
            )
            self.outbox.put(self.cancel_refused(request_id, error))

    def _remember_ended(self, request_id: str) -> None:
        self._ended[request_id] = None
        self._ended.move_to_end(request_id)
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _begin(self, start: Start) -> None:
        request_id = self.request_id(start)
        error: MeshError | None
        if not request_id:
            error = _no_request_id()
        elif request_id in self._running:
            error = AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"{self.kind} {request_id!r} already runs on this session",
                metadata={"param": "request_id"},
            )
        else:
            error = self.refusal(request_id)
        if error is not None:
            self.outbox.put(self.error_event(request_id, error))
            if request_id and request_id not in self._running:
                self._remember_ended(request_id)  # refused: a cancel of it has nothing to stop
        else:
            self._running[request_id] = asyncio.create_task(
                self._run(request_id, start), name=f"{self.kind}-{request_id}"
            )

    async def _run(self, request_id: str, start: Start) -> None:
        try:
            await self.run(request_id, start)
        except MeshError as err:
            self.outbox.put(self.error_event(request_id, err))
        except Exception:
            log.exception("%s %s failed", self.kind, request_id)
            self.outbox.put(self.error_event(request_id, self.internal))
        finally:
            del self._running[request_id]
            self._remember_ended(request_id)
            self.outbox.poke()


def _no_request_id() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_REQUEST, "request_id is required on a session", metadata={"param": "request_id"}
    )
