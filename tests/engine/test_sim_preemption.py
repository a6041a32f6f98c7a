"""Incremental KV allocation and recompute preemption in the simulator:
victims, unbroken streams, outputs identical to uninterrupted runs, and the
pool drained at the end. Time is the simulated clock, never the wall clock."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import (
    FinishReason,
    GeneratedTokens,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
    SamplingOptions,
)
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.sampler import DeterministicSampler
from llmmesh.engine.sim.sequence import SimSequence
from llmmesh.engine.sim.tokenizer import SimTokenizer
from tests.engine.support import FAST, Generation, SteppedSimulator, collect

SAMPLER = DeterministicSampler(SimTokenizer())
# Room for any one reply (8 + 40 tokens, 12 blocks), not for three at once.
SMALL_POOL = dataclasses.replace(FAST, kv_blocks=24)
REPLY = 40


def long_reply_prompts(count: int, min_length: int = REPLY) -> list[tuple[int, ...]]:
    """Distinct 8-token prompts whose natural reply is at least ``min_length``."""
    found: list[tuple[int, ...]] = []
    start = 300
    while len(found) < count:
        prompt = tuple(range(start, start + 8))
        if SAMPLER.plan(prompt, SamplingOptions()).natural_length >= min_length:
            found.append(prompt)
        start += 8
    return found


def uninterrupted_tokens(request: GenerationRequest, context_window: int) -> list[int]:
    """What the request streams with a pool to itself: position-indexed draws."""
    plan = SAMPLER.plan(request.prompt_token_ids, request.sampling)
    limit = min(plan.natural_length, context_window - len(request.prompt_token_ids))
    if request.sampling.max_tokens is not None:
        limit = min(limit, request.sampling.max_tokens)
    return SAMPLER.tokens(plan, limit)


def assert_one_stream(generation: Generation) -> None:
    """One GenerationStarted first, one GenerationFinished last, contiguous
    offsets, usage equal to what was streamed."""
    kinds = [type(event) for event in generation.events]
    assert kinds.count(GenerationStarted) == 1 and kinds[0] is GenerationStarted
    assert kinds.count(GenerationFinished) == 1 and kinds[-1] is GenerationFinished
    assert set(kinds[1:-1]) <= {GeneratedTokens}
    offsets = [delta.output_token_offset for delta in generation.deltas if delta.token_ids]
    assert offsets == list(range(len(offsets)))
    assert generation.finished is not None
    assert generation.finished.output_tokens == len(generation.token_ids)


def running_of(simulator: SteppedSimulator) -> list[SimSequence]:
    """Sequences that will be in the next step's batch: those holding KV
    blocks, less those aborted (they leave first)."""
    return [
        s
        for s in simulator.sequences.values()
        if s.allocation is not None and s.request_id not in simulator.aborted
    ]


def step_checking_victims(simulator: SteppedSimulator) -> list[SimSequence]:
    """One step; asserts its victims were the running sequences with the
    largest (priority, arrival) and that, as in vLLM, a step that preempts
    admits nobody. Returns the victims, lowest priority first."""
    before = {s.request_id: s.preemptions for s in simulator.sequences.values()}
    candidates = sorted(running_of(simulator), key=lambda s: (s.request.priority, s.arrival), reverse=True)
    simulator.step()
    victims = [s for s in simulator.sequences.values() if s.preemptions > before[s.request_id]]
    assert all(s.preemptions == before[s.request_id] + 1 for s in victims)
    assert {s.request_id for s in victims} == {s.request_id for s in candidates[: len(victims)]}
    if victims:
        admitted = {s.request_id for s in running_of(simulator)} - {s.request_id for s in candidates}
        assert not admitted, "a step that preempted also admitted"
    return sorted(victims, key=lambda s: (s.request.priority, s.arrival), reverse=True)


def test_the_lowest_priority_latest_sequence_is_preempted_first() -> None:
    simulator = SteppedSimulator(SMALL_POOL)
    first, low, late = long_reply_prompts(3)
    options = SamplingOptions(max_tokens=REPLY)
    simulator.submit(GenerationRequest("first", first, options, priority=0))
    simulator.submit(GenerationRequest("low", low, options, priority=1))
    simulator.submit(GenerationRequest("late", late, options, priority=0))
    victims: list[str] = []
    for _ in range(1000):
        victims += [victim.request_id for victim in step_checking_victims(simulator)]
        if not simulator.scheduler.running and not simulator.scheduler.waiting:
            break
    assert simulator.scheduler.preemptions == len(victims) > 0
    assert victims[0] == "low", "the lowest priority goes first"
    assert "first" not in victims, "the earliest of the highest priority is never the victim"
    for request_id, generation in simulator.generations.items():
        assert_one_stream(generation)
        sequence = simulator.sequences[request_id]
        assert generation.token_ids == uninterrupted_tokens(sequence.request, SMALL_POOL.context_window)
    assert simulator.pool.used_blocks == 0


@pytest.mark.asyncio
async def test_preempted_streams_match_an_uninterrupted_run() -> None:
    prompts = long_reply_prompts(4, min_length=24)
    requests = [GenerationRequest(f"r{i}", prompt, priority=i % 2) for i, prompt in enumerate(prompts)]

    async def run_all(engine_settings: EngineSettings) -> tuple[list[Generation], SimBackend]:
        backend = SimBackend(engine_settings)
        await backend.start()
        try:
            generations = await asyncio.gather(*(collect(backend, request) for request in requests))
        finally:
            await backend.close()
        return list(generations), backend

    squeezed, small = await run_all(dataclasses.replace(FAST, kv_blocks=28))
    roomy, big = await run_all(FAST)
    assert small.scheduler.preemptions > 0 and big.scheduler.preemptions == 0
    for tight, free in zip(squeezed, roomy, strict=True):
        assert_one_stream(tight)
        assert tight.token_ids == free.token_ids and tight.text == free.text
        assert tight.finished == free.finished
    assert small.pool.used_blocks == 0 and small.load().kv_cache_usage == 0.0
    registry = small.prometheus_registry()
    labels = {"model_name": FAST.model, "engine": "0"}
    assert registry.get_sample_value("vllm:num_preemptions_total", labels) == small.scheduler.preemptions


@pytest.mark.asyncio
async def test_a_reply_that_outgrows_the_whole_pool_ends_with_length() -> None:
    tiny = dataclasses.replace(FAST, kv_blocks=4)  # 16 tokens
    backend = SimBackend(tiny)
    await backend.start()
    try:
        prompt = long_reply_prompts(1, min_length=12)[0]
        reply = await collect(backend, GenerationRequest("big", prompt))
        # The prompt's 8 tokens and 8 outputs fill the pool; the ninth output
        # is sampled, but its KV slot does not exist.
        assert reply.finished is not None and reply.finished.reason is FinishReason.LENGTH
        assert reply.token_ids == uninterrupted_tokens(GenerationRequest("big", prompt), 512)[:9]
        assert_one_stream(reply)
        with pytest.raises(InvalidArgument) as raised:
            await collect(backend, GenerationRequest("huge", tuple(range(300, 316))))
        assert raised.value.reason == Reason.PROMPT_TOO_LONG
        accepted = await collect(backend, GenerationRequest("fits", tuple(range(300, 315))))
        assert accepted.finished is not None and accepted.finished.output_tokens == 2
        assert backend.pool.used_blocks == 0
    finally:
        await backend.close()


# Prompts over a small alphabet share prefixes, so preemption victims often
# hit their own or each other's cached blocks on readmission. The pool (12
# blocks, 48 tokens) holds any prompt, a few replies at once, and not every
# reply alone, so preemptions and LENGTH for lack of room both happen.
CAPACITY_BLOCKS = 12
requests = st.tuples(
    st.lists(st.integers(300, 302), min_size=1, max_size=20),
    st.integers(0, 2),
    st.integers(1, 40),
)
submits = st.tuples(st.just("submit"), requests)
actions = st.lists(
    st.one_of(
        submits,
        submits,
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    min_size=3,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(actions)
def test_any_interleaving_keeps_streams_whole_and_the_pool_consistent(
    script: list[tuple[str, object]],
) -> None:
    engine_settings = dataclasses.replace(FAST, kv_blocks=CAPACITY_BLOCKS, max_num_batched_tokens=8)
    simulator = SteppedSimulator(engine_settings)
    submitted: list[str] = []
    aborted: set[str] = set()

    def step() -> None:
        step_checking_victims(simulator)
        pool = simulator.pool
        assert pool.used_blocks + pool.free_blocks == pool.total_blocks
        in_batch = running_of(simulator)
        held = sum(len(s.allocation.blocks) for s in in_batch if s.allocation is not None)
        assert held == sum(pool.block(i).ref_count for i in range(pool.total_blocks))
        for sequence in in_batch:
            assert sequence.allocation is not None
            assert len(sequence.allocation.blocks) == pool.blocks_for(sequence.computed_tokens)

    for kind, arg in script:
        if kind == "submit":
            assert isinstance(arg, tuple)
            prompt, priority, max_tokens = arg
            request_id = f"q{len(submitted)}"
            request = GenerationRequest(request_id, tuple(prompt), SamplingOptions(max_tokens), priority)
            simulator.submit(request)
            submitted.append(request_id)
        elif kind == "step":
            assert isinstance(arg, int)
            for _ in range(arg):
                step()
        elif submitted:
            assert isinstance(arg, int)
            request_id = submitted[arg % len(submitted)]
            if simulator.abort(request_id):
                aborted.add(request_id)
    for _ in range(5000):
        if not simulator.scheduler.running and not simulator.scheduler.waiting:
            break
        step()
    assert simulator.pool.used_blocks == 0
    for request_id in submitted:
        generation = simulator.generations[request_id]
        sequence = simulator.sequences[request_id]
        assert generation.finished is not None, request_id
        if request_id in aborted and generation.started is None:
            assert generation.events == [generation.finished]  # cancelled while waiting
            continue
        assert_one_stream(generation)
        expected = uninterrupted_tokens(sequence.request, FAST.context_window)
        produced = len(generation.token_ids)
        assert generation.token_ids == expected[:produced]
        if generation.finished.reason is FinishReason.CANCELLED or produced == len(expected):
            continue
        # Cut short without a cancel: only when its next token's KV could
        # not fit even the whole pool.
        assert generation.finished.reason is FinishReason.LENGTH
        assert sequence.prompt_tokens + produced > CAPACITY_BLOCKS * FAST.block_size
