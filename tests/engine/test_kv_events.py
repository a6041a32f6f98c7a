"""The retained KV event log: contiguous sequences, replay, gaps, live follow."""

from __future__ import annotations

import asyncio

import pytest

from llmmesh.engine.kv_events import BlockRemoved, KvEventBatch, KvEventLog


def removed(n: int) -> BlockRemoved:
    return BlockRemoved(block_hashes=(bytes([n]),))


def test_sequences_are_contiguous_from_one_and_replay_resumes() -> None:
    log = KvEventLog(retention=10)
    for n in range(5):
        log.append(removed(n))
    assert [e.sequence for e in log.read_after(0).events] == [1, 2, 3, 4, 5]
    batch = log.read_after(3)
    assert not batch.gap and [e.sequence for e in batch.events] == [4, 5]
    assert log.read_after(5) == KvEventBatch((), gap=False)


def test_dropped_events_are_reported_as_a_gap() -> None:
    log = KvEventLog(retention=3)
    for n in range(6):
        log.append(removed(n))
    batch = log.read_after(1)
    assert batch.gap and [e.sequence for e in batch.events] == [4, 5, 6]
    assert not log.read_after(3).gap
    # A cursor from another process of the pod (beyond the newest event).
    assert log.read_after(99).gap


@pytest.mark.asyncio
async def test_follow_replays_then_streams_live_events() -> None:
    log = KvEventLog(retention=10)
    log.append(removed(1))
    feed = log.follow(0)
    first = await anext(feed)
    assert [e.sequence for e in first.events] == [1]
    pending = asyncio.ensure_future(anext(feed))
    await asyncio.sleep(0)
    assert not pending.done()
    log.append(removed(2))
    live = await asyncio.wait_for(pending, timeout=5)
    assert [e.sequence for e in live.events] == [2]
    log.close()
    with pytest.raises(StopAsyncIteration):
        await anext(feed)


@pytest.mark.asyncio
async def test_follow_yields_an_empty_first_batch_when_caught_up() -> None:
    log = KvEventLog(retention=10)
    feed = log.follow(0)
    assert await anext(feed) == KvEventBatch((), gap=False)
    await feed.aclose()
