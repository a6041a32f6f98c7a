"""Slow start of a pod back from an outage: its batch counts as a share
growing linearly from 10% to all of it over the window, so the load
scorers send it a growing share of the turns rather than every turn a
cold, idle pod would draw; a pod starting with the region is not slowed.
The pool's health checks mark the return (time.monotonic is the clock)."""

from __future__ import annotations

import asyncio

import pytest

from llmmesh.engine.server import start_engine
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.placement.router import KvAffinityRouter, LoadBoard, RoutingPolicy
from llmmesh.region.tokenizer_client import TokenizerClient
from tests.region.support import pod_settings

pytestmark = pytest.mark.asyncio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_returning_pod_takes_a_growing_share() -> None:
    pods = list(await asyncio.gather(*(start_engine(pod_settings(pod_id=f"pod-{n}")) for n in range(2))))
    pool = EnginePool([pod.address for pod in pods])
    clock = Clock()
    loads = LoadBoard(pool, slow_start_s=10.0, clock=clock)
    try:
        await pool.check()
        warm, back = pool.pods
        assert warm.returned_s == back.returned_s == 0.0  # starting with the region
        assert loads.capacity_share(back) == 1.0
        # The pod goes down and comes back: the next good health check marks its return.
        pool.mark_failed(back)
        await pool.check()
        assert back.healthy and back.returned_s > 0
        clock.now = back.returned_s
        assert loads.capacity_share(back) == pytest.approx(LoadBoard.MIN_SHARE)
        clock.now = back.returned_s + 5
        assert loads.capacity_share(back) == pytest.approx(0.5)
        clock.now = back.returned_s + 10
        assert loads.capacity_share(back) == 1.0 and loads.capacity_share(warm) == 1.0

        # Least loaded, early in the window: the idle returning pod takes
        # one turn, then counts as full, and the warm pod takes the rest.
        router = KvAffinityRouter(RoutingPolicy.LEAST_LOADED, pool, None, TokenizerClient(pool), loads=loads)
        clock.now = back.returned_s + 0.5
        placed = []
        for _ in range(4):
            decision = await router.choose("llmmesh-tiny", [1, 2, 3])
            decision.pod.in_flight += 1
            placed.append(decision.pod_id)
        assert placed.count(back.pod_id) == 1, placed
        # After the window it is an ordinary pod again and evens the load out.
        clock.now = back.returned_s + 10
        decision = await router.choose("llmmesh-tiny", [1, 2, 3])
        assert decision.pod_id == back.pod_id
    finally:
        await pool.close()
        await asyncio.gather(*(pod.stop(0) for pod in pods))
