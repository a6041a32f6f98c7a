"""The client side of a session stream: one long-lived gRPC stream that
carries many requests (turns, generations), each named by its request id.

A request costs one message out instead of a call set-up, and the server
sends the events of all its requests together (a decode step of a whole
batch in one message). A reader task hands each event to its request's
queue, which holds at most that request's events, so a slow reader holds
up no other request.

When the stream breaks (the server died, the connection reset), every
request on it raises the error ``broken`` makes, and the next request
opens a new stream. Used by the region for its pods'
``EngineService.GenerateSession`` and by the edge for its regions'
``ChatService.ChatSession``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Generic, TypeAlias, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from llmmesh.core.errors import AlreadyExists, MeshError, Reason

log = logging.getLogger(__name__)

Request = TypeVar("Request")
Event = TypeVar("Event")
Call: TypeAlias = grpc.aio.StreamStreamCall
_WRITE_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


def ends_its_request(event: Message) -> bool:
    """Whether a session event, whose oneof is ``event``, is its request's
    last: ``finished`` or ``error``."""
    return event.WhichOneof("event") in ("finished", "error")


class SessionRequest(Generic[Request, Event]):
    """One request on a session: its events in order, then None."""

    def __init__(self, session: SessionClient[Request, Event], request_id: str) -> None:
        self.request_id = request_id
        self._session = session
        self._events: asyncio.Queue[Event | MeshError] = asyncio.Queue()
        self.ended = False
        """The request's last event has been read (or the stream broke)."""

    def _push(self, event: Event | MeshError) -> None:
        self._events.put_nowait(event)

    async def read(self) -> Event | None:
        """The next event; None after the last. Raises the session's
        ``broken`` error when the stream broke first."""
        if self.ended:
            return None
        event = await self._events.get()
        if isinstance(event, MeshError):
            self.ended = True
            raise event
        self.ended = self._session.is_last(event)
        return event

    async def __aiter__(self) -> AsyncIterator[Event]:
        while (event := await self.read()) is not None:
            yield event

    async def cancel(self, reason: str) -> None:
        """Ask the server to stop the request; its events go on to the end."""
        await self._session.write(self._session.cancel_request(self.request_id, reason))

    def abandon(self, reason: str) -> None:
        """The caller stops reading: forget the request and, unless it
        ended, have the server stop it."""
        self._session.forget(self, reason)


class SessionClient(Generic[Request, Event]):
    """One server's session stream, opened on first use and again after it
    broke.

    ``open_call`` opens the stream; ``events_of`` splits a message into
    ``(request_id, event)`` pairs; ``is_last`` says an event ends its
    request; ``cancel_request`` builds the message that stops a request;
    ``broken`` builds the error of a broken stream from what broke it.
    """

    def __init__(
        self,
        name: str,
        open_call: Callable[[], Call],
        events_of: Callable[[Any], Iterable[tuple[str, Event]]],
        is_last: Callable[[Event], bool],
        cancel_request: Callable[[str, str], Request],
        broken: Callable[[str], MeshError],
    ) -> None:
        self._name = name
        self._open_call = open_call
        self._events_of = events_of
        self.is_last = is_last
        self.cancel_request = cancel_request
        self._broken = broken
        self._call: Call | None = None
        self._reader: asyncio.Task[None] | None = None
        self._requests: dict[str, SessionRequest[Request, Event]] = {}
        self._write_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> int:
        """Requests on the session now."""
        return len(self._requests)

    async def start(self, request_id: str, message: Request) -> SessionRequest[Request, Event]:
        """Send ``message``, which starts the request ``request_id``; its
        events follow on the returned request. Raises AlreadyExists when a
        request of that id runs on the session."""
        if request_id in self._requests:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request {request_id!r} already runs on {self._name}",
                metadata={"param": "request_id"},
            )
        request = SessionRequest(self, request_id)
        self._requests[request_id] = request
        if self._call is None:
            self._open()
        await self.write(message)
        return request

    async def write(self, message: Request) -> None:
        """Send one message; a failed write is the stream's failure, which
        its reader reports to every request."""
        call = self._call
        if call is None:
            return
        async with self._write_lock:
            try:
                await call.write(message)
            except _WRITE_ERRORS as err:
                log.debug("write to the session of %s failed: %s", self._name, err)

    def forget(self, request: SessionRequest[Request, Event], reason: str) -> None:
        if self._requests.get(request.request_id) is not request:
            return
        del self._requests[request.request_id]
        if not request.ended and self._call is not None:
            task = asyncio.create_task(self.write(self.cancel_request(request.request_id, reason)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _open(self) -> None:
        call = self._open_call()
        self._call = call
        self._reader = asyncio.create_task(self._read(call), name=f"session-{self._name}")

    async def _read(self, call: Call) -> None:
        try:
            async for message in call:
                for request_id, event in self._events_of(message):
                    request = self._requests.get(request_id)
                    if request is None:
                        continue  # abandoned by its caller
                    request._push(event)
                    if self.is_last(event):
                        del self._requests[request_id]
            failure = self._broken("it ended the session")
        except grpc.aio.AioRpcError as err:
            failure = self._broken(f"{err.code().name}: {err.details()}")
        if self._call is call:
            self._call = None
        requests, self._requests = self._requests, {}
        for request in requests.values():
            request._push(failure)
        if requests:
            log.warning("%s; %d requests on its session failed", failure.message, len(requests))

    async def close(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
