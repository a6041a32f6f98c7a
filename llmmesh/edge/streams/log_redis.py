"""The stream log in Redis (:class:`RedisStreamLog`), shared by every edge of
a deployment: a stream produced on one edge can be resumed, and cancelled,
on any other.

Keys, under ``prefix`` (``llmmesh:edge:stream:``):

- ``{id}:events``: a Redis stream of the log's entries (XADD with an exact
  MAXLEN of ``max_events``), read live with XREAD BLOCK;
- ``{id}:info``: a hash of who started the stream and whether it ended;
- ``{id}:reader``: present while a reader is attached and ``reader_grace_s``
  after, refreshed by the attached readers.

The events and info keys expire ``retention_s`` after their last renewal.
Every write renews them, and while a stream is live (opened and not yet
ended) the edge producing it also renews them every ``retention_s / 3``,
all its live streams in one pipeline, so a stream that stays silent longer
than ``retention_s`` (a long queue wait or prefill, a stalled region before
failover) does not expire under its readers. Once its end entry is written
the renewals stop, and the stream is forgotten ``retention_s`` later. A
stream whose producing edge died, or whose producer gave it up after a
failed write, is no longer renewed and goes the same way.

Cancellation requests travel on one pub/sub channel, ``{prefix}cancel``,
whose messages are stream ids; each edge acts on those it produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.client import Pipeline, PubSub

from llmmesh.core.tasks import cancel_and_wait, wait_event
from llmmesh.edge.streams.log import (
    CancelListener,
    EventsGone,
    LogEntry,
    Position,
    StreamInfo,
    StreamLog,
    StreamLogError,
)

log = logging.getLogger(__name__)

# How long one XREAD blocks before the reader checks that its stream still exists.
_BLOCK_MS = 1000
_READ_COUNT = 256


def open_redis(url: str) -> redis.asyncio.Redis:
    """A client for the stream log: reads block up to a second, so its
    socket timeout is longer than that."""
    return redis.asyncio.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=5.0)


def raise_if_cancelled() -> None:
    """Re-raise a cancellation redis-py swallowed: one that lands while a
    command runs is sometimes lost (the command returns normally), but the
    task still counts it. Without this a cancelled reader would go on
    following its stream, and a stopped loop would never stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _entry(fields: dict[bytes, bytes]) -> LogEntry:
    return LogEntry(
        event_id=int(fields[b"event_id"]),
        prev_id=int(fields[b"prev_id"]),
        frame=fields.get(b"frame", b""),
        end=fields.get(b"end") == b"1",
    )


class RedisStreamLog(StreamLog):
    """The log in Redis, shared across edges."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        max_events: int,
        retention_s: float,
        reader_grace_s: float,
        prefix: str = "llmmesh:edge:stream:",
    ) -> None:
        self._redis = client
        self._max_events = max_events
        self._retention_ms = max(1, round(retention_s * 1000))
        self._reader_grace_ms = max(1, round(reader_grace_s * 1000))
        self._prefix = prefix
        self._channel = f"{prefix}cancel"
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None
        # The live streams this edge produces, whose keys it keeps renewing.
        self._live: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    def _key(self, stream_id: str, kind: str) -> str:
        return f"{self._prefix}{stream_id}:{kind}"

    async def _run(self, call: Callable[[], Any]) -> Any:
        try:
            result = await call()
        except redis.exceptions.RedisError as err:
            raise StreamLogError(f"the stream log's Redis failed: {err}") from err
        raise_if_cancelled()
        return result

    async def _pipelined(self, build: Callable[[Pipeline], None]) -> list[Any]:
        async def execute() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                build(pipe)
                return list(await pipe.execute())

        result: list[Any] = await self._run(execute)
        return result

    async def start(self, on_cancel: CancelListener) -> None:
        # Subscribing happens in the listener, which retries: an edge starts
        # (and serves what needs no log) while its Redis is unreachable.
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._listener = asyncio.create_task(self._listen(self._pubsub, on_cancel), name="stream-log-cancels")
        self._renewer = asyncio.create_task(self._renew_forever(), name="stream-log-renewals")

    async def _listen(self, pubsub: PubSub, on_cancel: CancelListener) -> None:
        subscribed = False
        while True:
            try:
                if not subscribed:
                    await pubsub.subscribe(self._channel)
                    subscribed = True
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (redis.exceptions.RedisError, OSError) as err:
                log.warning("stream cancellations unheard, retrying in a second: %s", err)
                await asyncio.sleep(1.0)
                continue
            raise_if_cancelled()
            if message is not None and message.get("type") == "message":
                data = message["data"]
                on_cancel(data.decode() if isinstance(data, bytes) else str(data))

    async def _renew_forever(self) -> None:
        interval_s = self._retention_ms / 3000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.renew_live()
            except StreamLogError as err:
                log.warning("could not renew the live streams' expiry: %s", err)
            except Exception:
                # Renewals must outlive any one failure, or live streams expire.
                log.exception("renewing the live streams' expiry failed")

    async def renew_live(self) -> int:
        """Renew the expiry of every live stream this edge produces to
        ``retention_s``; returns how many streams it renewed. The background
        renewal calls this every ``retention_s / 3``."""
        streams = list(self._live)
        if not streams:
            return 0

        def build(pipe: Pipeline) -> None:
            for stream_id in streams:
                pipe.pexpire(self._key(stream_id, "events"), self._retention_ms)
                pipe.pexpire(self._key(stream_id, "info"), self._retention_ms)

        # A stream that ends while this runs may get one renewal after its
        # end's: its retention then counts from a moment later, no more.
        await self._pipelined(build)
        return len(streams)

    async def close(self) -> None:
        await cancel_and_wait(self._renewer)
        self._renewer = None
        await cancel_and_wait(self._listener)
        self._listener = None
        if self._pubsub is not None:
            with contextlib.suppress(redis.exceptions.RedisError):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = None
        await self._redis.aclose()

    async def open(self, stream_id: str, info: StreamInfo) -> None:
        info_key = self._key(stream_id, "info")

        def build(pipe: Pipeline) -> None:
            pipe.hset(
                info_key,
                mapping={
                    "key_id": info.key_id,
                    "tenant_id": info.tenant_id,
                    "region": info.region,
                    "ended": 0,
                },
            )
            pipe.pexpire(info_key, self._retention_ms)
            pipe.set(self._key(stream_id, "reader"), 1, px=self._reader_grace_ms)

        await self._pipelined(build)
        self._live.add(stream_id)

    async def _produced(self, stream_id: str, build: Callable[[Pipeline], None]) -> None:
        """Run a producer's write to its stream; a failed one stops the
        stream's renewals, since its producer then gives it up without an
        end entry, and renewed it would be kept for ever."""
        try:
            await self._pipelined(build)
        except BaseException:
            self._live.discard(stream_id)
            raise

    async def append(self, stream_id: str, entry: LogEntry) -> None:
        events, info_key = self._key(stream_id, "events"), self._key(stream_id, "info")
        fields: dict[str | bytes, str | bytes | int] = {
            "event_id": entry.event_id,
            "prev_id": entry.prev_id,
            "frame": entry.frame,
            "end": int(entry.end),
        }

        def build(pipe: Pipeline) -> None:
            pipe.xadd(events, fields, maxlen=self._max_events, approximate=False)  # type: ignore[arg-type]
            if entry.end:
                pipe.hset(info_key, "ended", "1")
            pipe.pexpire(events, self._retention_ms)
            pipe.pexpire(info_key, self._retention_ms)

        await self._produced(stream_id, build)
        if entry.end:
            self._live.discard(stream_id)

    async def set_region(self, stream_id: str, region: str) -> None:
        info_key = self._key(stream_id, "info")

        def build(pipe: Pipeline) -> None:
            pipe.hset(info_key, "region", region)
            pipe.pexpire(info_key, self._retention_ms)

        await self._produced(stream_id, build)

    async def info(self, stream_id: str) -> StreamInfo | None:
        info_key = self._key(stream_id, "info")
        key_id, tenant_id, region = await self._run(
            lambda: self._redis.hmget(info_key, ["key_id", "tenant_id", "region"])
        )
        if key_id is None:
            return None
        return StreamInfo(key_id.decode(), (tenant_id or b"").decode(), (region or b"").decode())

    async def ended(self, stream_id: str) -> bool:
        info_key = self._key(stream_id, "info")
        return bool(await self._run(lambda: self._redis.hget(info_key, "ended")) == b"1")

    async def follow(self, stream_id: str, after: int) -> AsyncIterator[LogEntry]:
        events, info_key = self._key(stream_id, "events"), self._key(stream_id, "info")
        position = Position(after)
        last = "0-0"
        while True:
            replies = await self._run(
                partial(self._redis.xread, {events: last}, count=_READ_COUNT, block=_BLOCK_MS)
            )
            if not replies:
                if not await self._run(lambda: self._redis.exists(info_key)):
                    raise EventsGone(f"stream {stream_id} is unknown or expired")
                continue
            for redis_id, fields in replies[0][1]:
                last = redis_id.decode() if isinstance(redis_id, bytes) else str(redis_id)
                entry = _entry(fields)
                if position.admit(entry):
                    yield entry
                if entry.end:
                    return

    @asynccontextmanager
    async def _attached(self, stream_id: str) -> AsyncIterator[None]:
        key = self._key(stream_id, "reader")
        detached = asyncio.Event()

        async def refresh() -> None:
            # Stops on the event too: a cancellation redis-py swallows must not keep it going.
            while not detached.is_set():
                try:
                    await self._redis.set(key, 1, px=self._reader_grace_ms)
                except redis.exceptions.RedisError as err:
                    log.warning("could not mark stream %s as read: %s", stream_id, err)
                await wait_event(detached, self._reader_grace_ms / 3000)

        task = asyncio.create_task(refresh(), name=f"stream-reader-{stream_id}")
        try:
            yield
        finally:
            # The key expires by itself reader_grace_s after the last refresh.
            detached.set()
            await cancel_and_wait(task)

    def attach(self, stream_id: str) -> AbstractAsyncContextManager[None]:
        return self._attached(stream_id)

    async def has_reader(self, stream_id: str) -> bool:
        key = self._key(stream_id, "reader")
        return bool(await self._run(lambda: self._redis.exists(key)))

    async def ping(self) -> None:
        await self._run(self._redis.ping)

    async def publish_cancel(self, stream_id: str) -> None:
        await self._run(lambda: self._redis.publish(self._channel, stream_id))
