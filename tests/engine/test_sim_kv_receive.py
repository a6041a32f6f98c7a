"""A decode pod's side of a KV transfer in the simulator: it takes room for
the received blocks first (waiting for a batch slot), pulls only the blocks
it lacks, and keeps them pinned until the generation holds them, so a busy
pod cannot evict a received prompt before decoding it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llmmesh.engine.backend import GenerationRequest, KvTransferSpec, SamplingOptions
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.kv_blocks import full_block_hashes
from tests.engine.support import FAST, SLOW, collect

PROMPT = tuple(range(10, 47))  # 37 tokens: 9 full blocks of 4 and a tail
FULL_BLOCKS = 9


def spec(request_id: str) -> KvTransferSpec:
    return KvTransferSpec("prefill-0", request_id, len(PROMPT), FULL_BLOCKS + 1, 0)


def decode_request(
    request_id: str, prompt: tuple[int, ...] = PROMPT, max_tokens: int = 6
) -> GenerationRequest:
    sampling = SamplingOptions(max_tokens=max_tokens, seed=3)
    return GenerationRequest(request_id, prompt, sampling, kv_transfer=spec(request_id))


@pytest_asyncio.fixture
async def decode_pod() -> AsyncIterator[SimBackend]:
    backend = SimBackend(dataclasses.replace(FAST, pod_id="decode-0", pod_role="decode", kv_blocks=24))
    await backend.start()
    yield backend
    await backend.close()


@pytest.mark.asyncio
async def test_received_blocks_stay_pinned_until_the_generation_holds_them(decode_pod: SimBackend) -> None:
    pool = decode_pod.pool
    pinned = await decode_pod.receiver.receive(decode_request("turn-1"))
    assert pinned is not None and len(pinned.blocks) == FULL_BLOCKS
    assert pool.free_blocks == pool.total_blocks - FULL_BLOCKS
    # Another sequence takes every other block: it cannot evict the pinned ones.
    other = tuple(range(300, 300 + 4 * (pool.total_blocks - FULL_BLOCKS)))
    taken = pool.allocate(other, len(other))
    assert taken is not None
    assert pool.allocate((900, 901, 902, 903, 904), 5) is None
    assert set(full_block_hashes(PROMPT, 4)) <= pool.resident_hashes()
    pool.free(taken)
    pool.free(pinned)
    assert pool.used_blocks == 0


@pytest.mark.asyncio
async def test_a_decode_pod_pulls_only_the_blocks_it_does_not_hold(decode_pod: SimBackend) -> None:
    receiver = decode_pod.receiver
    first = await collect(decode_pod, decode_request("turn-1"))
    assert first.finished is not None and first.finished.output_tokens == 6
    assert receiver.pulled_blocks == FULL_BLOCKS
    await collect(decode_pod, decode_request("turn-2"))
    # Its own cache holds all but the last full block (never served from cache).
    assert receiver.pulled_blocks == FULL_BLOCKS + 1
    assert receiver.no_room == 0
    assert decode_pod.pool.used_blocks == 0


@pytest.mark.asyncio
async def test_a_decode_phase_waits_for_a_batch_slot_instead_of_recomputing() -> None:
    settings = dataclasses.replace(SLOW, pod_id="decode-1", pod_role="decode", max_num_seqs=1, kv_blocks=24)
    backend = SimBackend(settings)
    await backend.start()
    try:
        busy = asyncio.create_task(collect(backend, decode_request("busy", tuple(range(500, 521)), 12)))
        for _ in range(500):
            if backend.scheduler.running:
                break
            await asyncio.sleep(0.01)
        assert backend.scheduler.running == 1
        waiting = await collect(backend, decode_request("turn-1"))
        first = await busy
    finally:
        await backend.close()
    assert first.finished is not None and first.finished.output_tokens == 12
    assert waiting.finished is not None and waiting.finished.output_tokens == 6
    assert backend.receiver.no_room == 0
    assert backend.receiver.pulled_blocks == 5 + FULL_BLOCKS
    assert backend.pool.used_blocks == 0
