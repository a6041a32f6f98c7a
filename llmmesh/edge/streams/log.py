"""The stream log: every streamed turn's SSE events, kept a while in a
bounded log per stream so that readers can follow it live and a client can
resume it after a dropped connection.

A stream's id is its completion id. One producer appends a stream's entries
in order; any number of readers follow it from a position (an event id).
The log is bounded three ways: at most ``max_events`` entries per stream (the
oldest are dropped first), a stream is forgotten ``retention_s`` after its
last entry, and the in-process log keeps at most ``max_streams`` finished
streams. A reader that falls behind what its stream still holds gets
:class:`EventsGone` rather than a silent gap.

Each entry records the id of the event before it, so a reader detects a gap
from the entries alone, whatever the backend. This module has the contract
and the in-process log (embedded meshes); :mod:`edge.streams.log_redis` is
the shared one (deployments with several edges).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

CancelListener = Callable[[str], None]
"""Called with a stream id when some edge asks for that stream's cancellation."""


@dataclass(frozen=True)
class StreamInfo:
    """Who started a stream, and where it runs (the region serving it now:
    another after a failover): only ``key_id`` may resume or cancel it."""

    key_id: str
    tenant_id: str
    region: str


class LogEntry(NamedTuple):
    """One SSE event of a stream, or the stream's end.

    ``prev_id`` is the id of the event before this one (-1 for the first).
    The end entry comes last; it repeats the last event's id in both fields
    and its frame is ``data: [DONE]`` after a success, empty after an error.

    The in-process log keeps each as a plain tuple (:data:`_Held`).
    """

    event_id: int
    prev_id: int
    frame: bytes
    end: bool = False


class StreamLogError(Exception):
    """The log cannot be read or written (its store is unreachable)."""


class EventsGone(Exception):
    """The events a reader asked for are no longer in the log: the stream is
    unknown, expired, or went on further than the log holds."""


class Position:
    """A reader's place in a stream: the id of the last event it has."""

    def __init__(self, after: int) -> None:
        self.after = after

    def admit(self, entry: LogEntry) -> bool:
        """Whether ``entry`` is news to the reader; raises EventsGone when
        events between the reader's place and ``entry`` were dropped."""
        if entry.prev_id > self.after:
            raise EventsGone(
                f"events after {self.after} are no longer held; the first left is {entry.prev_id}"
            )
        if entry.end:
            return True
        if entry.event_id <= self.after:
            return False
        self.after = entry.event_id
        return True


class StreamLog(ABC):
    """The contract both logs keep."""

    @abstractmethod
    async def start(self, on_cancel: CancelListener) -> None:
        """Begin hearing cancellation requests other edges publish."""

    @abstractmethod
    async def close(self) -> None:
        """Stop hearing and release the store."""

    @abstractmethod
    async def open(self, stream_id: str, info: StreamInfo) -> None:
        """Create a stream's log; it counts as read until its first reader attaches."""

    @abstractmethod
    async def append(self, stream_id: str, entry: LogEntry) -> None:
        """Add the next entry; never waits for readers."""

    @abstractmethod
    async def set_region(self, stream_id: str, region: str) -> None:
        """Name the region serving the stream now (after a failover)."""

    @abstractmethod
    async def info(self, stream_id: str) -> StreamInfo | None:
        """Who started the stream, or None when it is unknown or expired."""

    @abstractmethod
    async def ended(self, stream_id: str) -> bool:
        """Whether the stream's end entry is in the log."""

    @abstractmethod
    def follow(self, stream_id: str, after: int) -> AsyncIterator[LogEntry]:
        """The stream's entries after event ``after`` (-1 for all), live,
        through the end entry. Raises EventsGone and StreamLogError."""

    @abstractmethod
    def attach(self, stream_id: str) -> AbstractAsyncContextManager[None]:
        """Count a reader as attached to the stream while inside."""

    @abstractmethod
    async def has_reader(self, stream_id: str) -> bool:
        """Whether a reader is attached, or left less than the reader grace ago."""

    @abstractmethod
    async def publish_cancel(self, stream_id: str) -> None:
        """Ask the edge producing the stream to cancel it."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise StreamLogError when the log's store does not answer now (readiness)."""


_Held = tuple[int, int, bytes, bool]
"""A retained entry as a plain tuple of plain values, which the garbage
collector stops tracking (it does so for exact tuples only, not for a
NamedTuple): a log retains every event of its streams for minutes, and as
tracked objects each would be walked again by every full collection, tens
of milliseconds with the events of a few thousand streams, during which the
edge relays nothing."""


@dataclass
class _Stream:
    info: StreamInfo
    entries: deque[_Held]
    dropped: int = 0
    ended_at: float | None = None
    readers: int = 0
    last_read_at: float = 0.0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)


class InProcessStreamLog(StreamLog):
    """The log in this process's memory: one edge, no sharing."""

    def __init__(
        self,
        *,
        max_events: int,
        max_streams: int,
        retention_s: float,
        reader_grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_events = max_events
        self._max_streams = max_streams
        self._retention_s = retention_s
        self._reader_grace_s = reader_grace_s
        self._clock = clock
        self._streams: dict[str, _Stream] = {}
        # Finished streams in the order they ended, for retention.
        self._finished: OrderedDict[str, float] = OrderedDict()
        self._on_cancel: CancelListener | None = None

    async def start(self, on_cancel: CancelListener) -> None:
        self._on_cancel = on_cancel

    async def close(self) -> None:
        self._on_cancel = None

    async def ping(self) -> None:
        return

    def _forget_old(self) -> None:
        now = self._clock()
        while self._finished:
            stream_id, ended_at = next(iter(self._finished.items()))
            if len(self._finished) <= self._max_streams and now - ended_at < self._retention_s:
                break
            del self._finished[stream_id]
            self._streams.pop(stream_id, None)

    def _get(self, stream_id: str) -> _Stream | None:
        self._forget_old()
        return self._streams.get(stream_id)

    def holds(self, stream_id: str) -> bool:
        """Whether the log knows the stream now."""
        return self._get(stream_id) is not None

    def held(self, stream_id: str) -> int:
        """Entries the log holds for a stream now (0 when unknown)."""
        stream = self._get(stream_id)
        return len(stream.entries) if stream else 0

    def streams(self) -> int:
        """Streams the log holds now, live and finished."""
        self._forget_old()
        return len(self._streams)

    async def open(self, stream_id: str, info: StreamInfo) -> None:
        self._forget_old()
        self._streams[stream_id] = _Stream(info, deque(maxlen=self._max_events), last_read_at=self._clock())

    async def append(self, stream_id: str, entry: LogEntry) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.ended_at is not None:
            return
        if len(stream.entries) == self._max_events:
            stream.dropped += 1
        stream.entries.append((entry.event_id, entry.prev_id, entry.frame, entry.end))
        if entry.end:
            stream.ended_at = self._clock()
            self._finished[stream_id] = stream.ended_at
            self._forget_old()
        woken, stream.wakeup = stream.wakeup, asyncio.Event()
        woken.set()

    async def set_region(self, stream_id: str, region: str) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.info = replace(stream.info, region=region)

    async def info(self, stream_id: str) -> StreamInfo | None:
        stream = self._get(stream_id)
        return stream.info if stream else None

    async def ended(self, stream_id: str) -> bool:
        stream = self._get(stream_id)
        return stream is not None and stream.ended_at is not None

    async def follow(self, stream_id: str, after: int) -> AsyncIterator[LogEntry]:
        stream = self._get(stream_id)
        if stream is None:
            raise EventsGone(f"stream {stream_id} is unknown or expired")
        position = Position(after)
        index = 0  # counts every entry ever appended, dropped ones included
        while True:
            wakeup = stream.wakeup
            entries = stream.entries
            fresh = min(len(entries), stream.dropped + len(entries) - index)
            # From the right end: deque indexing is cheap near its ends.
            new = [entries[i] for i in range(len(entries) - fresh, len(entries))]
            index = stream.dropped + len(entries)
            for held in new:
                entry = LogEntry(*held)
                if position.admit(entry):
                    yield entry
                if entry.end:
                    return
            await wakeup.wait()

    @asynccontextmanager
    async def _attached(self, stream_id: str) -> AsyncIterator[None]:
        stream = self._streams.get(stream_id)
        if stream is None:
            yield
            return
        stream.readers += 1
        try:
            yield
        finally:
            stream.readers -= 1
            stream.last_read_at = self._clock()

    def attach(self, stream_id: str) -> AbstractAsyncContextManager[None]:
        return self._attached(stream_id)

    async def has_reader(self, stream_id: str) -> bool:
        stream = self._streams.get(stream_id)
        if stream is None:
            return False
        return stream.readers > 0 or self._clock() - stream.last_read_at < self._reader_grace_s

    async def publish_cancel(self, stream_id: str) -> None:
        # Every stream of an in-process log is produced by this edge.
        if self._on_cancel is not None:
            self._on_cancel(stream_id)
