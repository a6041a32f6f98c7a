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

A stream started with ``x-llmmesh-resumable: true`` is detached: the
starting client's disconnect does not cancel it, so the client can resume
it; it is cancelled once no reader has followed it for
``detached_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llmmesh.edge import metrics
from llmmesh.edge.chunks import DONE, ChunkStream, SseEvent, blocked_categories, sse_data
from llmmesh.edge.errors import OpenAIError, from_mesh_error
from llmmesh.edge.failover import FailoverTurn
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import EventsGone, InProcessStreamLog, LogEntry, StreamInfo, StreamLog, StreamLogError
from llmmesh.core.errors import MeshError
from llmmesh.core.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def build_stream_log(settings: EdgeSettings) -> StreamLog:
    """The shared Redis log when ``redis_url`` is set, else the in-process one."""
    grace_s = settings.detached_timeout_ms / 1000
    if settings.redis_url:
        from llmmesh.edge.streams.log_redis import RedisStreamLog, open_redis

        return RedisStreamLog(
            open_redis(settings.redis_url),
            max_events=settings.stream_log_max_events,
            retention_s=settings.stream_retention_s,
            reader_grace_s=grace_s,
        )
    return InProcessStreamLog(
        max_events=settings.stream_log_max_events,
        max_streams=settings.stream_log_max_streams,
        retention_s=settings.stream_retention_s,
        reader_grace_s=grace_s,
    )


def log_unavailable() -> OpenAIError:
    """What a request needing an unreachable stream log answers."""
    return OpenAIError(503, "the stream log is unavailable", type="server_error", code="unavailable")


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
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str = ""

    def request_cancel(self, reason: str) -> None:
        if not self.cancel.is_set():
            self.cancel_reason = reason
            self.cancel.set()


class _Reader:
    """Follows a stream's log from a position and yields SSE frames; knows
    whether it reached the stream's end."""

    def __init__(self, log: StreamLog, stream_id: str, after: int) -> None:
        self._log = log
        self._stream_id = stream_id
        self._after = after
        self.finished = False
        self._frames = self._read()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._frames

    async def aclose(self) -> None:
        await self._frames.aclose()

    async def _read(self) -> AsyncGenerator[bytes, None]:
        try:
            async with self._log.attach(self._stream_id):
                async for entry in self._log.follow(self._stream_id, self._after):
                    if entry.frame:
                        yield entry.frame
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

    def __init__(self, settings: EdgeSettings, log: StreamLog) -> None:
        self._settings = settings
        self.log = log
        self._productions: dict[str, _Production] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.log.start(self._cancel_here)

    async def close(self) -> None:
        """Stop every producer (their region calls are dropped) and the log."""
        for task in list(self._tasks):
            await cancel_and_wait(task)
        await self.log.close()

    async def begin(
        self,
        turn: FailoverTurn,
        chunks: ChunkStream,
        info: StreamInfo,
        *,
        detached: bool,
        arrived: float,
    ) -> None:
        """Open the turn's log and start its producer. The log exists when
        this returns, so the stream can be resumed on any edge at once."""
        stream_id = chunks.completion_id
        try:
            await self.log.open(stream_id, info)
        except StreamLogError as err:
            turn.close()
            raise log_unavailable() from err
        production = _Production(stream_id, detached)
        self._productions[stream_id] = production
        task = asyncio.create_task(
            self._produce(production, turn, chunks, arrived), name=f"produce-{stream_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def response(
        self, stream_id: str, after: int, headers: Mapping[str, str], *, cancel_on_drop: bool = False
    ) -> StreamingResponse:
        """An SSE response following the stream after event ``after``;
        with ``cancel_on_drop`` the turn is cancelled if the client leaves
        before the end."""
        on_drop = (lambda: self._cancel_here(stream_id, "client disconnected")) if cancel_on_drop else None
        return _LogResponse(_Reader(self.log, stream_id, after), headers, on_drop)

    async def cancel(self, stream_id: str) -> bool:
        """Ask for the stream's cancellation wherever it is produced, and wait
        (up to ``cancel_grace_ms``) for its end; False when it had already
        ended."""
        if await self.log.ended(stream_id):
            return False
        if stream_id in self._productions:
            self._cancel_here(stream_id, "cancelled by the client")
        else:
            await self.log.publish_cancel(stream_id)
        try:
            async with asyncio.timeout(self._settings.cancel_grace_ms / 1000):
                async for _ in self.log.follow(stream_id, sys.maxsize):
                    pass
        except (TimeoutError, EventsGone):
            pass
        return True

    def _cancel_here(self, stream_id: str, reason: str = "cancelled by the client") -> None:
        production = self._productions.get(stream_id)
        if production is not None:
            production.request_cancel(reason)

    async def _produce(
        self, production: _Production, turn: FailoverTurn, chunks: ChunkStream, arrived: float
    ) -> None:
        stream_id = production.stream_id
        region = turn.region
        watcher = asyncio.create_task(self._watch(production, turn), name=f"watch-{stream_id}")
        appender = _Appender(self.log, stream_id)
        try:
            await appender.event(chunks.role())
            first_token = True
            async for delta in turn.deltas():
                if first_token:
                    metrics.TIME_TO_FIRST_TOKEN.observe(time.monotonic() - arrived)
                    first_token = False
                metrics.OUTPUT_TOKENS.inc(len(delta.token_ids))
                if turn.region != region:
                    region = turn.region
                    await self.log.set_region(stream_id, region)
                await appender.event(chunks.delta(delta))
            if turn.region != region:
                await self.log.set_region(stream_id, turn.region)
            await appender.event(chunks.finish(turn.reason, blocked_categories(turn.safety), turn.usage))
            if chunks.include_usage:
                await appender.event(chunks.usage(turn.usage))
            await appender.end(DONE)
        except MeshError as err:
            error = from_mesh_error(err)
            metrics.STREAM_ERRORS.labels(code=error.code or "unknown").inc()
            # An error mid-stream ends the stream without [DONE], as OpenAI does.
            await self._end_with_error(appender, chunks.error(error.body()))
        except StreamLogError as err:
            log.error("stream %s lost its log, cancelling the turn: %s", stream_id, err)
            await turn.cancel("the edge lost the stream log")
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

    @staticmethod
    async def _end_with_error(appender: _Appender, event: SseEvent) -> None:
        try:
            await appender.event(event)
            await appender.end(b"")
        except StreamLogError as err:
            log.error("stream %s: could not log its error: %s", appender.stream_id, err)

    async def _watch(self, production: _Production, turn: FailoverTurn) -> None:
        """Cancel the turn when asked, or when a detached stream has gone
        unread for ``detached_timeout_ms``; drop the call if the region has
        not ended it ``cancel_grace_ms`` later."""
        timeout_s = self._settings.detached_timeout_ms / 1000
        if production.detached:
            while not await wait_event(production.cancel, max(0.05, timeout_s / 4)):
                try:
                    read = await self.log.has_reader(production.stream_id)
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
    """Appends a stream's events in order, each naming the one before it."""

    def __init__(self, log: StreamLog, stream_id: str) -> None:
        self._log = log
        self.stream_id = stream_id
        self._last = -1

    async def event(self, event: SseEvent) -> None:
        await self._log.append(self.stream_id, LogEntry(event.event_id, self._last, event.frame))
        self._last = event.event_id

    async def end(self, frame: bytes) -> None:
        await self._log.append(self.stream_id, LogEntry(self._last, self._last, frame, end=True))


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
