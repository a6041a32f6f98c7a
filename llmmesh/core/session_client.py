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
import itertools
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


def _is_start(message: Any) -> bool:
    return bool(message.WhichOneof("action") == "start")


def _batch(starts: list[Any]) -> Any:
    """One session message of the same type holding ``starts``' starts, in order."""
    batch = type(starts[0])()
    batch.starts.starts.extend(message.start for message in starts)
    return batch


def ends_its_request(event: Message) -> bool:
    """Whether a session event, whose oneof is ``event``, is its request's
    last: ``finished`` or ``error``."""
    return event.WhichOneof("event") in ("finished", "error")


class _Interruption:
    """What :meth:`SessionRequest.interrupt` queues: ``error``, which ends the reading, not the request."""

    def __init__(self, error: MeshError) -> None:
        self.error = error


class SessionRequest(Generic[Request, Event]):
    """One request on a session: its events in order, then None."""

    def __init__(self, session: SessionClient[Request, Event], request_id: str) -> None:
        self.request_id = request_id
        self._session = session
        self._events: asyncio.Queue[Event | MeshError | _Interruption] = asyncio.Queue()
        self.ended = False
        """The request's last event has been read (or the stream broke)."""
        self._last_event_s = 0.0

    def _push(self, event: Event | MeshError | _Interruption) -> None:
        self._events.put_nowait(event)

    @property
    def last_event_s(self) -> float:
        """When the server last sent the request an event, on the loop's clock (0: never)."""
        return self._last_event_s

    @property
    def unread(self) -> int:
        """Events received and not read yet."""
        return self._events.qsize()

    def interrupt(self, error: MeshError) -> None:
        """Stop the request's reader: ``read`` raises ``error`` after the
        events received before it (a caller's own timeout, say). The request
        has not ended: abandoning it then has the server stop it."""
        self._push(_Interruption(error))

    async def read(self) -> Event | None:
        """The next event; None after the last. Raises the session's
        ``broken`` error when the stream broke first."""
        if self.ended:
            return None
        event = await self._events.get()
        if isinstance(event, _Interruption):
            raise event.error
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


class SilenceWatch:
    """Stops the reading of ``request`` when its server sent it nothing for
    ``limit_s``: ``read`` then raises the error ``stalled`` makes of the
    limit (see :meth:`SessionRequest.interrupt`).

    One timer for the whole request, moved on to its last event's time each
    time it fires, rather than a timeout around every read: an event costs
    its reader no timer. A request with events still unread is behind its
    reader, not stalled; its server's silence counts from when it was last
    found so. Changing ``limit_s`` (a first event's wait, then a gap's)
    takes effect at once."""

    def __init__(
        self, request: SessionRequest[Any, Any], limit_s: float, stalled: Callable[[float], MeshError]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._request = request
        self._limit_s = limit_s
        self._stalled = stalled
        self._since = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._arm()

    @property
    def limit_s(self) -> float:
        return self._limit_s

    @limit_s.setter
    def limit_s(self, limit_s: float) -> None:
        changed, self._limit_s = limit_s != self._limit_s, limit_s
        if changed and self._timer is not None:
            self._timer.cancel()
            self._arm()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        due = max(self._since, self._request.last_event_s) + self._limit_s
        self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if self._request.unread:
            self._since = now
        if now < max(self._since, self._request.last_event_s) + self._limit_s:
            self._arm()
            return
        self._timer = None
        self._request.interrupt(self._stalled(self._limit_s))


class SessionClient(Generic[Request, Event]):
    """One server's session stream, opened on first use and again after it
    broke.

    ``open_call`` opens the stream; ``events_of`` splits a message into
    ``(request_id, event)`` pairs; ``is_last`` says an event ends its
    request; ``cancel_request`` builds the message that stops a request;
    ``broken`` builds the error of a broken stream from what broke it;
    ``batch_starts`` says the server takes several starts in one message.
    Session messages hold a oneof ``action`` of ``start``, ``cancel`` and,
    where batched, ``starts`` (its repeated ``starts``), as
    ``ChatSessionRequest`` and ``GenerateSessionRequest`` do.

    Messages go out one write at a time, in the order they were given. A
    write is a round trip through gRPC's completion queue, so starts given
    while one is written wait for it; they then go out together, as one
    ``starts`` message: a burst of turns (a batch of replies ended
    together, their callers' next requests arriving at once) reaches the
    server in one message rather than one per turn, spread over as many
    writes.
    """

    def __init__(
        self,
        name: str,
        open_call: Callable[[], Call],
        events_of: Callable[[Any], Iterable[tuple[str, Event]]],
        is_last: Callable[[Event], bool],
        cancel_request: Callable[[str, str], Request],
        broken: Callable[[str], MeshError],
        batch_starts: bool = False,
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
        # Messages given and not yet written, in order (see write).
        self._unwritten: list[Request] = []
        self._batch_starts = batch_starts
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
        """Send one message, returning once it is written (with what was
        given before it); a failed write is the stream's failure, which its
        reader reports to every request.

        Whoever holds the write lock writes everything given by then, so a
        message given while another is written goes out with the messages
        given beside it: the lock is first come, first served, and a writer
        that finds its message written already (by the writer before it,
        which it waited for) returns at once, leaving what was given since
        to its own writers, who wait behind it. A writer cancelled
        while it waits takes its message back. Others' messages go out in a
        task of their own that holds the lock until they are written, so a
        writer cancelled while it writes them loses none of them."""
        if self._call is None:
            return
        self._unwritten.append(message)
        try:
            await self._write_lock.acquire()
        except asyncio.CancelledError:
            self._take_back(message)
            raise
        handed_on = False
        try:
            call = self._call
            if call is None or not any(unwritten is message for unwritten in self._unwritten):
                return  # written by an earlier holder, or the stream is gone
            given, self._unwritten = self._unwritten, []
            if len(given) == 1:
                await self._send(call, given)
                return
            writing = asyncio.create_task(self._send(call, self._coalesced(given)))
            writing.add_done_callback(lambda _: self._write_lock.release())
            handed_on = True
            await asyncio.shield(writing)
        finally:
            if not handed_on:
                self._write_lock.release()

    async def _send(self, call: Call, messages: list[Request]) -> None:
        try:
            for message in messages:
                await call.write(message)
        except _WRITE_ERRORS as err:
            log.debug("write to the session of %s failed: %s", self._name, err)

    def _take_back(self, message: Request) -> None:
        for index, unwritten in enumerate(self._unwritten):
            if unwritten is message:
                del self._unwritten[index]
                return

    def _coalesced(self, given: list[Request]) -> list[Request]:
        """``given`` as the messages to write: each run of two or more
        starts as one ``starts`` message, every other message as it is, in
        order."""
        if not self._batch_starts:
            return given
        out: list[Request] = []
        for starting, run in itertools.groupby(given, key=_is_start):
            messages = list(run)
            out.extend([_batch(messages)] if starting and len(messages) > 1 else messages)
        return out

    def forget(self, request: SessionRequest[Request, Event], reason: str) -> None:
        if self._requests.get(request.request_id) is not request:
            return
        del self._requests[request.request_id]
        if not request.ended and self._call is not None:
            task = asyncio.create_task(self.write(self.cancel_request(request.request_id, reason)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _open(self) -> None:
        # Messages still unwritten were given for the stream that broke,
        # whose requests have failed: they must not start on this one.
        self._unwritten = []
        call = self._open_call()
        self._call = call
        self._reader = asyncio.create_task(self._read(call), name=f"session-{self._name}")

    async def _read(self, call: Call) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for message in call:
                now = loop.time()
                for request_id, event in self._events_of(message):
                    request = self._requests.get(request_id)
                    if request is None:
                        continue  # abandoned by its caller
                    request._last_event_s = now
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
