"""Continuous batching in the simulator: prefill cost, priorities, aborts,
duplicates and load, measured on the simulated clock, never the wall clock."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from llmmesh.core.errors import AlreadyExists, Reason
from llmmesh.engine.backend import FinishReason, GenerationRequest, GenerationStarted
from llmmesh.engine.sim.backend import SimBackend
from tests.engine.support import FAST, SLOW, collect

PROMPT = tuple(range(300, 340))


async def wait_for(condition: object, backend: SimBackend) -> None:
    """Poll the simulator until ``condition()`` holds (bounded)."""
    assert callable(condition)
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never true; load={backend.load()}")


@pytest.mark.asyncio
async def test_prefix_hits_shorten_the_prefill(backend: SimBackend) -> None:
    clock = backend.scheduler.clock_s
    cold = await collect(backend, GenerationRequest("cold", PROMPT))
    cold_s = backend.scheduler.clock_s - clock
    clock = backend.scheduler.clock_s
    warm = await collect(backend, GenerationRequest("warm", PROMPT))
    warm_s = backend.scheduler.clock_s - clock
    assert cold.started is not None and warm.started is not None
    assert cold.started.cached_prompt_tokens == 0
    assert warm.started.cached_prompt_tokens == 36  # nine 4-token blocks; the last is recomputed
    # One step prefills the prompt and yields the first token; every later
    # step decodes one token. Only the prefill step differs: 40 tokens cold,
    # 4 warm.
    timing = backend.timing
    decodes_s = (len(cold.token_ids) - 1) * timing.decode_step_s(1)
    assert cold_s == pytest.approx(timing.step_s(1, 40) + decodes_s)
    assert warm_s == pytest.approx(timing.step_s(1, 4) + decodes_s)
    assert cold_s - warm_s == pytest.approx(timing.prefill_per_token_s * 36)
    load = backend.load()
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (80, 36)
    assert load.kv_cache_usage == 0.0 and load.running == 0


@pytest.mark.asyncio
async def test_lower_priority_values_run_first() -> None:
    backend = SimBackend(dataclasses.replace(FAST, max_num_seqs=1))
    await backend.start()
    try:
        order: list[str] = []

        async def run(request_id: str, priority: int) -> None:
            async for event in backend.generate(GenerationRequest(request_id, PROMPT, priority=priority)):
                if isinstance(event, GenerationStarted):
                    order.append(request_id)

        blocker = asyncio.create_task(run("blocker", 0))
        await wait_for(lambda: backend.scheduler.running == 1, backend)
        waiters = [
            asyncio.create_task(run(rid, prio))
            for rid, prio in [("late-low", 5), ("urgent", -1), ("normal-1", 1), ("normal-2", 1)]
        ]
        await wait_for(lambda: backend.scheduler.waiting == 4, backend)
        await asyncio.gather(blocker, *waiters)
        assert order == ["blocker", "urgent", "normal-1", "normal-2", "late-low"]
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_abort_frees_the_running_slot_for_the_next_request() -> None:
    backend = SimBackend(dataclasses.replace(SLOW, max_num_seqs=1))
    await backend.start()
    try:
        first = asyncio.create_task(collect(backend, GenerationRequest("first", PROMPT)))
        await wait_for(lambda: backend.scheduler.running == 1, backend)
        second = asyncio.create_task(collect(backend, GenerationRequest("second", (1, 2, 3))))
        await wait_for(lambda: backend.scheduler.waiting == 1, backend)
        assert await backend.abort("first")
        cancelled = await first
        assert cancelled.finished is not None and cancelled.finished.reason is FinishReason.CANCELLED
        assert cancelled.finished.output_tokens == len(cancelled.token_ids) < 12
        await wait_for(lambda: backend.scheduler.waiting == 0 and backend.scheduler.running == 1, backend)
        assert await backend.abort("second")
        assert not await backend.abort("never-submitted")
        await second
        assert backend.load().kv_cache_usage == 0.0
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_waiting_request_can_be_aborted() -> None:
    backend = SimBackend(dataclasses.replace(SLOW, max_num_seqs=1))
    await backend.start()
    try:
        running = asyncio.create_task(collect(backend, GenerationRequest("running", PROMPT)))
        await wait_for(lambda: backend.scheduler.running == 1, backend)
        waiting = asyncio.create_task(collect(backend, GenerationRequest("waiting", PROMPT)))
        await wait_for(lambda: backend.scheduler.waiting == 1, backend)
        await backend.abort("waiting")
        result = await waiting
        assert result.started is None
        assert result.finished is not None and result.finished.reason is FinishReason.CANCELLED
        await backend.abort("running")
        await running
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_running_request_id_cannot_be_reused() -> None:
    backend = SimBackend(SLOW)
    await backend.start()
    try:
        first = asyncio.create_task(collect(backend, GenerationRequest("same", PROMPT)))
        await wait_for(lambda: backend.scheduler.running == 1, backend)
        with pytest.raises(AlreadyExists) as raised:
            await collect(backend, GenerationRequest("same", PROMPT))
        assert raised.value.reason == Reason.DUPLICATE_REQUEST
        await backend.abort("same")
        await first
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_closing_the_generator_aborts_the_request(backend: SimBackend) -> None:
    events = backend.generate(GenerationRequest("closed", PROMPT))
    await anext(events)
    await events.aclose()
    await wait_for(lambda: backend.scheduler.running == 0, backend)
    assert backend.load().kv_cache_usage == 0.0


@pytest.mark.asyncio
async def test_batched_steps_take_longer_per_token(backend: SimBackend) -> None:
    timing = backend.timing
    assert timing.decode_step_s(timing.max_num_seqs) == pytest.approx(2 * timing.decode_step_s(0))
    steps = backend.scheduler.steps
    replies = await asyncio.gather(
        *(collect(backend, GenerationRequest(f"r{i}", (i + 10,) * 5)) for i in range(4))
    )
    longest = max(len(reply.token_ids) for reply in replies)
    # Four sequences batched together take as many steps as the longest one.
    assert backend.scheduler.steps - steps <= longest + 1
