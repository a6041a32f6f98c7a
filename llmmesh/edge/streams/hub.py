"""Streamed turns, split into one producer and any number of readers.

The producer is a task per turn: it reads the region's gRPC stream as fast
as the region sends, turns each event into its SSE event and appends it to
the stream log. Readers are HTTP responses following the log from a
position: the one that started the turn, and any that resume it. A slow
reader therefore never holds up the producer or any other stream, and what
a stream costs in memory is what the log's bounds allow.

Cancelling (``POST /v1/streams/{id}/cancel``, or the starting client
disconnecting) sends ChatCancel to the region, which aborts the engine
request; the producer goes on reading until the region's usage and finish
arrive, so the stream still ends with its finish chunk (``finish_reason:
"cancelled"``, carrying the billed usage), its usage chunk when asked, and
``[DONE]``, and the tokens produced are billed. A region that does not end
the turn within ``cancel_grace_ms`` of the cancel has its call dropped
(which aborts and bills as well).

A region that fails mid-stream is replaced by a zone peer continuing the
turn (:mod:`edge.failover`): the log goes on with the next event id, and
its metadata names the region serving now, which a resume reports.

Events are framed as OpenAI frames them unless the reader opted into event
ids (:mod:`edge.streams.framing`); the log holds the ``data:`` frames and
their ids, so each reader gets its own framing of the same stream.

A stream started with ``x-llmmesh-resumable: true`` is detached: the
starting client's disconnect does not cancel it, so the client can resume
it; it is cancelled once no reader has followed it for
``detached_timeout_ms``.

Each zone's streams live in that zone's log only (:mod:`edge.streams.zones`):
a turn, a resume and a cancel name the tenant's zone, and the hub reads and
writes that zone's log and no other.

With a shared (Redis) log, the producer also keeps the stream in this
edge's own memory for a short while, and readers on this edge follow that
copy: a stream goes on for its client whatever happens to Redis. The shared
log is what makes a stream resumable on any edge, and writing to it is
best-effort: a stream whose log cannot be opened (within
``stream_log_timeout_ms``) runs unlogged and not resumable (never
detached), and a stream whose log write fails or outlasts that timeout
stops being logged there and streams on. Both are counted in
``llmmesh_edge_streams_unlogged_total``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llmmesh.core.errors import MeshError
from llmmesh.core.hop_timing import HopStamps
from llmmesh.core.tasks import cancel_and_wait, wait_event
from llmmesh.edge import metrics
from llmmesh.edge.chunks import (
    Events,
    SseEvent,
    StreamFrames,
    blocked_categories,
    each_event,
    sse_data,
    with_id,
)
from llmmesh.edge.errors import OpenAIError, from_mesh_error
from llmmesh.edge.failover import FailoverTurn
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import (
    EventsGone,
    InProcessStreamLog,
    LogEntry,
    StreamInfo,
    StreamLog,
    StreamLogError,
)
from llmmesh.edge.streams.zones import ZoneStreamLogs

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


LOCAL_RETENTION_S = 10.0
"""How long this edge's own copy of a stream it produced is kept after the
stream's end: long enough for its client's response to start reading it.
Resumes later than that read the shared log."""


def log_unavailable() -> OpenAIError:
    """What a request needing an unreachable stream log answers."""
    return OpenAIError(
        503,
        "stream resumption and cancellation are unavailable: the stream log cannot be reached; "
        "new streams run without resumability until it is back",
        type="server_error",
        code="stream_log_unavailable",
    )


def not_found(stream_id: str) -> OpenAIError:
    """What a resume or cancel of a stream the caller may not see answers."""
    return OpenAIError(
        404, f"No stream found with id '{stream_id}'.", param="stream_id", code="stream_not_found"
    )


@dataclass
class _Production:
    """A turn this edge is producing."""

    stream_id: str
    detached: bool
    log: StreamLog
    """The log of the stream's zone."""
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str = ""

    def request_cancel(self, reason: str) -> None:
        if not self.cancel.is_set():
            self.cancel_reason = reason
            self.cancel.set()


class _Reader:
    """Follows a stream's log from a position and yields SSE frames, each
    behind its ``id:`` line with ``event_ids``; knows whether it reached the
    stream's end."""

    def __init__(
        self, log: StreamLog, stream_id: str, after: int, *, event_ids: bool, presence: StreamLog
    ) -> None:
        self._log = log
        # Where the reader counts as attached: the shared log, which every edge asks.
        self._presence = presence
        self._stream_id = stream_id
        self._after = after
        self._event_ids = event_ids
        self.finished = False
        self._frames = self._read()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._frames

    async def aclose(self) -> None:
        await self._frames.aclose()

    async def _read(self) -> AsyncGenerator[bytes, None]:
        try:
            async with self._presence.attach(self._stream_id):
                async for entry in self._log.follow(self._stream_id, self._after):
                    if not entry.frame:
                        continue
                    # [DONE] (the end entry) is a marker, not an event: it has no id.
                    framed = self._event_ids and not entry.end
                    yield with_id(entry.event_id, entry.frame) if framed else entry.frame
        except EventsGone as err:
            # No id: the client's Last-Event-ID still names what it has.
            yield sse_data(OpenAIError(410, str(err), code="stream_events_expired").body())
        except StreamLogError as err:
            log.warning("stream %s: %s", self._stream_id, err)
            yield sse_data(log_unavailable().body())
        self.finished = True


class _LogResponse(StreamingResponse):
    """An SSE response over a :class:`_Reader`; ``on_drop`` runs when the
    client left before the stream's end."""

    def __init__(
        self, reader: _Reader, headers: Mapping[str, str], on_drop: Callable[[], None] | None
    ) -> None:
        super().__init__(reader, media_type="text/event-stream", headers={**headers, **SSE_HEADERS})
        self._reader = reader
        self._on_drop = on_drop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Detach now rather than whenever the generator is collected.
            await self._reader.aclose()
            if not self._reader.finished and self._on_drop is not None:
                self._on_drop()


class StreamHub:
    """Runs this edge's producers and serves readers of any edge's streams."""

    def __init__(self, settings: EdgeSettings, logs: ZoneStreamLogs) -> None:
        self._settings = settings
        self.logs = logs
        # This edge's own copy of the streams it produces in a shared log,
        # which its readers follow; none when every zone's log is in this process.
        self._local: InProcessStreamLog | None = None
        if logs.shared():
            self._local = InProcessStreamLog(
                max_events=settings.stream_log_max_events,
                max_streams=settings.stream_log_max_streams,
                retention_s=min(LOCAL_RETENTION_S, settings.stream_retention_s),
                reader_grace_s=settings.detached_timeout_ms / 1000,
            )
        self.log_timeout_s = settings.stream_log_timeout_ms / 1000
        self._productions: dict[str, _Production] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.logs.start(self._cancel_here)

    async def close(self) -> None:
        """Stop every producer (their region calls are dropped) and the logs."""
        for task in list(self._tasks):
            await cancel_and_wait(task)
        await self.logs.close()

    def _copy_for(self, log: StreamLog) -> InProcessStreamLog | None:
        """This edge's copy of the streams written to ``log``: none for a log in this process."""
        return None if isinstance(log, InProcessStreamLog) else self._local

    async def begin(
        self,
        turn: FailoverTurn,
        chunks: StreamFrames,
        info: StreamInfo,
        *,
        zone: str,
        detached: bool,
        arrived: float,
        hops: HopStamps | None = None,
    ) -> bool:
        """Open the turn's log (in ``zone``'s, the tenant's) and start its
        producer; whether the stream is resumable. When it is, its log exists when this returns, so the
        stream can be resumed on any edge at once; when the shared log
        cannot be opened, the stream runs on this edge alone, not detached.
        ``hops``, the turn's stamps so far: the first delta and its first
        chunk written end their last hops, and then they are observed."""
        stream_id = chunks.completion_id
        log = self.logs.of(zone)
        logged = await self._open(stream_id, info, log)
        production = _Production(stream_id, detached and logged, log)
        self._productions[stream_id] = production
        local = self._copy_for(log)
        appender = _Appender(log, local, stream_id, logged=logged, timeout_s=self.log_timeout_s)
        task = asyncio.create_task(
            self._produce(production, turn, chunks, arrived, appender, hops), name=f"produce-{stream_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return logged

    async def _open(self, stream_id: str, info: StreamInfo, shared: StreamLog) -> bool:
        """Open the stream in this edge's copy and the shared log; whether the shared one took it."""
        local = self._copy_for(shared)
        if local is None:
            await shared.open(stream_id, info)
            return True
        await local.open(stream_id, info)
        try:
            async with asyncio.timeout(self.log_timeout_s):
                await shared.open(stream_id, info)
        except (StreamLogError, TimeoutError) as err:
            metrics.STREAMS_UNLOGGED.labels(reason="log_unreachable").inc()
            log.warning("stream %s runs unlogged, not resumable: %s", stream_id, err or "timed out")
            return False
        return True

    def response(
        self,
        stream_id: str,
        after: int,
        headers: Mapping[str, str],
        *,
        zone: str,
        cancel_on_drop: bool = False,
        event_ids: bool = False,
    ) -> StreamingResponse:
        """An SSE response following the stream (of a tenant of ``zone``) after event ``after``, its
        events with ``id:`` lines when ``event_ids``; with ``cancel_on_drop``
        the turn is cancelled if the client leaves before the end."""
        on_drop = (lambda: self._cancel_here(stream_id, "client disconnected")) if cancel_on_drop else None
        log = self.logs.of(zone)
        local = self._copy_for(log)
        # This edge's copy when it holds the stream: its readers never wait on the shared log.
        followed = local if local is not None and local.holds(stream_id) else log
        reader = _Reader(followed, stream_id, after, event_ids=event_ids, presence=log)
        return _LogResponse(reader, headers, on_drop)

    async def cancel(self, stream_id: str, zone: str) -> bool:
        """Ask for the stream's (of a tenant of ``zone``) cancellation wherever
        it is produced, and wait (up to ``cancel_grace_ms``) for its end;
        False when it had already ended."""
        log = self.logs.of(zone)
        if await log.ended(stream_id):
            return False
        if stream_id in self._productions:
            self._cancel_here(stream_id, "cancelled by the client")
        else:
            await log.publish_cancel(stream_id)
        try:
            async with asyncio.timeout(self._settings.cancel_grace_ms / 1000):
                async for _ in log.follow(stream_id, sys.maxsize):
                    pass
        except (TimeoutError, EventsGone):
            pass
        return True

    def _cancel_here(self, stream_id: str, reason: str = "cancelled by the client") -> None:
        production = self._productions.get(stream_id)
        if production is not None:
            production.request_cancel(reason)

    async def _produce(
        self,
        production: _Production,
        turn: FailoverTurn,
        chunks: StreamFrames,
        arrived: float,
        appender: _Appender,
        hops: HopStamps | None = None,
    ) -> None:
        stream_id = production.stream_id
        region = turn.region
        watcher = asyncio.create_task(self._watch(production, turn), name=f"watch-{stream_id}")
        settles = False
        try:
            opening = chunks.opening()
            if opening is not None:
                await appender.events(opening)
            first_token = True
            async for delta in turn.deltas():
                if first_token:
                    metrics.TIME_TO_FIRST_TOKEN.labels(chunks.model, region).observe(
                        time.monotonic() - arrived
                    )
                    if hops is not None:
                        hops.stamp("region")
                metrics.OUTPUT_TOKENS.inc(len(delta.token_ids))
                if turn.region != region:
                    region = turn.region
                    await appender.region(region)
                await appender.events(chunks.delta(delta))
                if first_token:
                    first_token = False
                    if hops is not None:
                        hops.stamp("edge_out")
                        hops.observe(metrics.HOPS)
            if turn.region != region:
                await appender.region(turn.region)
            await appender.events(chunks.finish(turn.reason, blocked_categories(turn.safety), turn.usage))
            if chunks.include_usage:
                await appender.event(chunks.usage(turn.usage))
            await appender.end(chunks.end_frame)
            settles = turn.settles_when_done
        except MeshError as err:
            error = from_mesh_error(err)
            metrics.STREAM_ERRORS.labels(code=error.code or "unknown").inc()
            # An error mid-stream ends the stream without [DONE], as OpenAI does.
            await self._end_with_error(appender, chunks.error(error.body()))
            if turn.lost_by_mesh:
                # The client has what was streamed, and no more: the turn is billed that.
                await turn.settle(turn.delivered_tokens)
        except asyncio.CancelledError:
            # The edge is stopping: readers elsewhere learn the stream is over.
            # (Uncancelled for that last write, which a shared log checks for
            # pending cancellations; the task still ends cancelled.)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            body = OpenAIError(
                503, "the edge serving this stream stopped", type="server_error", code="unavailable"
            ).body()
            await self._end_with_error(appender, chunks.error(body))
            raise
        except Exception:
            log.exception("stream %s failed", stream_id)
            body = OpenAIError(500, "internal error", type="server_error", code="internal_error").body()
            await self._end_with_error(appender, chunks.error(body))
        finally:
            await cancel_and_wait(watcher)
            turn.close()
            self._productions.pop(stream_id, None)
        if settles:
            # The stream has ended whole; regions the turn left may have billed past it.
            await turn.settle(turn.delivered_tokens)

    @staticmethod
    async def _end_with_error(appender: _Appender, events: Events) -> None:
        await appender.events(events)
        await appender.end(b"")

    async def _watch(self, production: _Production, turn: FailoverTurn) -> None:
        """Cancel the turn when asked, or when a detached stream has gone
        unread for ``detached_timeout_ms``; drop the call if the region has
        not ended it ``cancel_grace_ms`` later."""
        timeout_s = self._settings.detached_timeout_ms / 1000
        if production.detached:
            while not await wait_event(production.cancel, max(0.05, timeout_s / 4)):
                try:
                    read = await production.log.has_reader(production.stream_id)
                except StreamLogError:
                    read = True
                if not read:
                    production.request_cancel("no reader for the detached stream")
        else:
            await production.cancel.wait()
        log.info("cancelling stream %s: %s", production.stream_id, production.cancel_reason)
        await turn.cancel(production.cancel_reason)
        await asyncio.sleep(self._settings.cancel_grace_ms / 1000)
        log.warning("stream %s: the region did not end the cancelled turn in time", production.stream_id)
        turn.close()


class _Appender:
    """Appends a stream's events in order, each naming the one before it:
    to this edge's copy (``local``), which never fails, and to the shared
    log while it takes them. A shared write that fails or outlasts
    ``timeout_s`` ends the stream's logging there (its readers elsewhere
    learn at its end that the events after that are gone), never the stream."""

    def __init__(
        self,
        shared: StreamLog,
        local: InProcessStreamLog | None,
        stream_id: str,
        *,
        logged: bool,
        timeout_s: float,
    ) -> None:
        self._shared = shared
        self._local = local
        self.stream_id = stream_id
        self._logged = logged
        # Opened in the shared log: its end is written there however the logging went.
        self._opened = logged
        self._timeout_s = timeout_s
        self._last = -1

    async def event(self, event: SseEvent) -> None:
        await self._write(LogEntry(event.event_id, self._last, event.frame))
        self._last = event.event_id

    async def events(self, events: Events) -> None:
        """Append one step's events in order."""
        for event in each_event(events):
            await self.event(event)

    async def region(self, region: str) -> None:
        """Name the region serving the stream now."""
        if self._local is not None:
            await self._local.set_region(self.stream_id, region)
        if self._logged:
            await self._shared_write(self._shared.set_region(self.stream_id, region))

    async def end(self, frame: bytes) -> None:
        entry = LogEntry(self._last, self._last, frame, end=True)
        if self._local is not None:
            await self._local.append(self.stream_id, entry)
        if self._logged:
            await self._shared_write(self._shared.append(self.stream_id, entry))
        elif self._opened:
            # One bounded try: readers of the shared log then hear the stream
            # is over and its later events are gone, rather than wait for it to expire.
            await self._shared_write(self._shared.append(self.stream_id, entry._replace(frame=b"")))

    async def _write(self, entry: LogEntry) -> None:
        if self._local is not None:
            await self._local.append(self.stream_id, entry)
        if self._logged:
            await self._shared_write(self._shared.append(self.stream_id, entry))

    async def _shared_write(self, write: Coroutine[Any, Any, None]) -> None:
        if self._local is None:
            await write  # the log is this process's own: it cannot fail
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await write
        except (StreamLogError, TimeoutError) as err:
            if not self._logged:
                return  # the end's one try, after the logging already stopped
            self._logged = False
            metrics.STREAMS_UNLOGGED.labels(reason="log_write_failed").inc()
            log.warning(
                "stream %s: its log write failed; it streams on, no longer resumable: %s",
                self.stream_id,
                err or "timed out",
            )


def parse_position(text: str | None, param: str) -> int:
    """An event id a client resumes after; a 400 when it is not one."""
    if text is None:
        return -1
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise OpenAIError(
            400, f"{param} must be a non-negative event id, got {text!r}", param=param, code="invalid_value"
        )
    return int(value)
