"""What a stream log retains is invisible to the garbage collector, so full
collections do not grow with the events it holds."""

from __future__ import annotations

import gc

import pytest

from llmmesh.edge.streams.log import InProcessStreamLog, LogEntry, StreamInfo


@pytest.mark.asyncio
async def test_retained_events_are_not_tracked_by_the_collector() -> None:
    log = InProcessStreamLog(max_events=1000, max_streams=100, retention_s=300, reader_grace_s=1)
    for stream in range(20):
        name = f"s{stream}"
        await log.open(name, StreamInfo("key", "tenant", "us-east"))
        for event in range(50):
            await log.append(name, LogEntry(event, event - 1, b"id: %d\ndata: {}\n\n" % event))
        await log.append(name, LogEntry(49, 49, b"data: [DONE]\n\n", end=True))
    gc.collect()
    entries = [entry async for entry in log.follow("s7", -1)]
    assert len(entries) == 51 and entries[-1].end and entries[3].frame == b"id: 3\ndata: {}\n\n"
    tracked = {id(o) for o in gc.get_objects()}
    held = [h for stream in ("s0", "s7", "s19") for h in log._streams[stream].entries]
    assert len(held) == 3 * 51
    assert not any(id(h) in tracked for h in held)
