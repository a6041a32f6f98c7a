"""The Redis stream log's expiry: a live stream's keys are renewed by the
edge producing it however long it stays silent, and expire ``retention_s``
after its end, after its producer gave it up, or after its edge stopped."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio
import redis.exceptions

from llmmesh.core.tasks import cancel_and_wait
from llmmesh.edge.streams.log import LogEntry, StreamInfo, StreamLogError
from llmmesh.edge.streams.log_redis import RedisStreamLog, open_redis

pytestmark = pytest.mark.asyncio

INFO = StreamInfo("key-1", "tenant-1", "region-a")
STREAM = "chatcmpl-expiry"
LONG_RETENTION_S = 60.0

LogFactory = Callable[[float], Awaitable[RedisStreamLog]]


class Keys:
    """Reads one test's stream keys directly, under its own prefix."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def key(self, kind: str, stream_id: str = STREAM) -> str:
        return f"{self.prefix}{stream_id}:{kind}"

    async def pttl(self, kind: str, stream_id: str = STREAM) -> int:
        """Milliseconds left to the key; -1 with no expiry, -2 when gone."""
        return int(await self.client.pttl(self.key(kind, stream_id)))

    async def shorten(self, kind: str, ttl_ms: int, stream_id: str = STREAM) -> None:
        """Set the key's expiry as if time had passed since its last renewal."""
        assert await self.client.pexpire(self.key(kind, stream_id), ttl_ms)


@pytest_asyncio.fixture
async def keys(redis_url: str) -> AsyncIterator[Keys]:
    client = redis.asyncio.Redis.from_url(redis_url)
    prefix = f"llmmesh:test:expiry:{uuid.uuid4().hex[:12]}:"
    try:
        yield Keys(client, prefix)
    finally:
        async for key in client.scan_iter(match=f"{prefix}*"):
            await client.delete(key)
        await client.aclose()


@pytest_asyncio.fixture
async def make_log(redis_url: str, keys: Keys) -> AsyncIterator[LogFactory]:
    """Logs sharing the test's prefix, as edges share a deployment's Redis;
    each started (renewing its live streams) and closed at the end."""
    logs: list[RedisStreamLog] = []

    async def make(retention_s: float) -> RedisStreamLog:
        stream_log = RedisStreamLog(
            open_redis(redis_url),
            max_events=64,
            retention_s=retention_s,
            reader_grace_s=5.0,
            prefix=keys.prefix,
        )
        await stream_log.start(lambda _stream_id: None)
        logs.append(stream_log)
        return stream_log

    try:
        yield make
    finally:
        for stream_log in logs:
            await stream_log.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``check`` until true; fail after ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not within {timeout_s} s: {what}")


def event(event_id: int) -> LogEntry:
    return LogEntry(event_id, event_id - 1, f"id: {event_id}\ndata: {{}}\n\n".encode())


def end(last_id: int) -> LogEntry:
    return LogEntry(last_id, last_id, b"data: [DONE]\n\n", end=True)


async def test_a_live_stream_silent_longer_than_its_retention_is_still_followed_elsewhere(
    make_log: LogFactory, keys: Keys
) -> None:
    producer = await make_log(1.0)
    other_edge = await make_log(1.0)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))

    async def read_all() -> list[LogEntry]:
        return [entry async for entry in other_edge.follow(STREAM, -1)]

    reader = asyncio.create_task(read_all())
    try:
        # Silent for well past the retention: only the producer's renewals keep the stream.
        await asyncio.sleep(2.5)
        assert not reader.done()
        assert 0 < await keys.pttl("info") <= 1000
        assert 0 < await keys.pttl("events") <= 1000
        assert await other_edge.info(STREAM) == INFO

        await producer.append(STREAM, end(0))
        async with asyncio.timeout(10):
            entries = await reader
    finally:
        await cancel_and_wait(reader)
    assert [(entry.event_id, entry.end) for entry in entries] == [(0, False), (0, True)]


async def test_the_producing_edge_renews_its_live_streams_in_the_background(
    make_log: LogFactory, keys: Keys
) -> None:
    producer = await make_log(1.0)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))
    # Longer than the retention: only a renewal brings it back within it.
    await keys.shorten("info", 60_000)
    await keys.shorten("events", 60_000)

    async def renewed() -> bool:
        return 0 < await keys.pttl("info") <= 1000 and 0 < await keys.pttl("events") <= 1000

    await eventually(renewed, "the live stream's keys renewed to the retention")


async def test_renewing_restores_a_live_streams_expiry_to_the_retention(
    make_log: LogFactory, keys: Keys
) -> None:
    producer = await make_log(LONG_RETENTION_S)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))
    await producer.open("chatcmpl-other", INFO)
    await keys.shorten("info", 1000)
    await keys.shorten("events", 1000)

    assert await producer.renew_live() == 2
    for kind in ("info", "events"):
        assert 1000 < await keys.pttl(kind) <= LONG_RETENTION_S * 1000


async def test_an_ended_stream_expires_its_retention_after_its_end(make_log: LogFactory, keys: Keys) -> None:
    producer = await make_log(LONG_RETENTION_S)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))
    await producer.append(STREAM, end(0))
    for kind in ("info", "events"):
        assert 0 < await keys.pttl(kind) <= LONG_RETENTION_S * 1000

    await keys.shorten("info", 1000)
    await keys.shorten("events", 1000)
    assert await producer.renew_live() == 0
    for kind in ("info", "events"):
        assert 0 < await keys.pttl(kind) <= 1000


@pytest.mark.parametrize("failing", ["append", "set_region"])
async def test_a_stream_whose_write_failed_is_no_longer_renewed(
    make_log: LogFactory, keys: Keys, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    producer = await make_log(LONG_RETENTION_S)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))

    def unreachable(*_args: Any, **_kwargs: Any) -> Any:
        raise redis.exceptions.ConnectionError("Redis is unreachable")

    write = partial(producer.append, STREAM, event(1))
    if failing == "set_region":
        write = partial(producer.set_region, STREAM, "region-b")
    with monkeypatch.context() as patch:
        patch.setattr(producer._redis, "pipeline", unreachable)
        with pytest.raises(StreamLogError):
            await write()

    await keys.shorten("info", 1000)
    assert await producer.renew_live() == 0
    assert 0 < await keys.pttl("info") <= 1000


async def test_a_stopped_edges_live_streams_still_expire(make_log: LogFactory, keys: Keys) -> None:
    producer = await make_log(1.0)
    await producer.open(STREAM, INFO)
    await producer.append(STREAM, event(0))
    # The edge stops without ending the stream (as one killed mid-stream).
    await producer.close()
    for kind in ("info", "events"):
        assert 0 < await keys.pttl(kind) <= 1000

    async def gone() -> bool:
        return await keys.pttl("info") == -2 and await keys.pttl("events") == -2

    await eventually(gone, "the stopped edge's stream forgotten")
