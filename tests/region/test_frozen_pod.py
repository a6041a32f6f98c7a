"""A turn waiting for its pod's first event when the pod freezes (SIGSTOP,
a cut link: its connection open, nothing answered): once the pool's health
checks find the pod down, the turn is given up on that pod (UNAVAILABLE,
so the placement puts it on another) — but only while another healthy pod
serves its model; a region with no other pod keeps waiting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.settings import RegionSettings
from llmmesh.region.turn import stream
from llmmesh.region.turn.stream import PodStream
from llmmesh.v1 import engine_service_pb2

pytestmark = pytest.mark.asyncio


async def _events(first: asyncio.Event) -> AsyncIterator[engine_service_pb2.GenerationEvent]:
    await first.wait()
    yield engine_service_pb2.GenerationEvent(request_id="r")


def _pool(*healthy: bool) -> EnginePool:
    # Channels are dialled lazily: nothing listens at these addresses.
    pool = EnginePool([f"127.0.0.1:{port}" for port in range(1, len(healthy) + 1)])
    for pod, up in zip(pool.pods, healthy, strict=True):
        pod.healthy, pod.model = up, "m"
    return pool


def _stream(pool: EnginePool) -> PodStream:
    return PodStream(RegionSettings(), None, None, None, pool=pool)  # type: ignore[arg-type]


async def test_a_pod_found_down_gives_up_the_waiting_turn() -> None:
    pool = _pool(True, True)
    frozen = pool.pods[0]
    waiting = asyncio.create_task(_stream(pool)._first_event(_events(asyncio.Event()), frozen, "m"))
    await asyncio.sleep(0.4)
    assert not waiting.done()  # a queue's wait is no failure
    frozen.healthy = False
    with pytest.raises(MeshError) as caught:
        await asyncio.wait_for(waiting, 2)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE and "health checks" in caught.value.message


async def test_with_no_other_pod_the_turn_keeps_waiting_and_gets_its_event(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stream, "SLOW_FIRST_EVENT_S", 0.3)
    pool = _pool(True, False)
    frozen, first = pool.pods[0], asyncio.Event()
    waiting = asyncio.create_task(_stream(pool)._first_event(_events(first), frozen, "m", "gen-1"))
    frozen.healthy = False
    with caplog.at_level(logging.INFO, logger=stream.__name__):
        await asyncio.sleep(0.6)
        assert not waiting.done()
        # A long wait is named in the log, once, with the pod's state.
        (slow,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert slow.startswith(f"generation gen-1: no first event from engine pod {frozen.pod_id} after 0.")
        assert slow.endswith("(pod down, 0 generations in flight on it; another healthy pod serves m: no)")
        first.set()
        event = await asyncio.wait_for(waiting, 2)
    assert event.request_id == "r"
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(f"generation gen-1: first event from engine pod {frozen.pod_id}")
    )
