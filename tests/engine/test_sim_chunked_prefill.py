"""Chunked prefill under the per-step token budget, on the simulated clock:
long prompts take several steps to their first token, decodes never stall
behind them, and partial prefills go before new admissions."""

from __future__ import annotations

import dataclasses

import pytest

from llmmesh.engine.backend import GenerationRequest
from llmmesh.engine.settings import EngineSettings
from tests.engine.support import FAST, SteppedSimulator

BUDGET = 16
CHUNKED = dataclasses.replace(FAST, max_num_batched_tokens=BUDGET)


def prompt(length: int, start: int = 300) -> tuple[int, ...]:
    return tuple(range(start, start + length))


def has_started(simulator: SteppedSimulator, request_id: str) -> bool:
    return simulator.generations[request_id].started is not None


def test_the_budget_must_hold_a_full_batch_of_decodes() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least max_num_seqs"):
        EngineSettings(max_num_seqs=64, max_num_batched_tokens=32)


def test_a_prompt_longer_than_the_budget_takes_several_steps_to_its_first_token() -> None:
    simulator = SteppedSimulator(CHUNKED)
    sequence = simulator.submit(GenerationRequest("long", prompt(50)))
    generation = simulator.generations["long"]
    chunks = []
    while not generation.deltas:
        chunks.append(simulator.step().tokens[sequence])
    assert chunks == [16, 16, 16, 2]
    assert generation.started is not None and generation.started.prompt_tokens == 50
    assert [delta.output_token_offset for delta in generation.deltas] == [0]
    timing = simulator.timing
    assert simulator.scheduler.clock_s == pytest.approx(sum(timing.step_s(1, chunk) for chunk in chunks))
    # From then on, one token per step, each step without prefill cost.
    clock = simulator.scheduler.clock_s
    assert simulator.step().tokens[sequence] == 1
    assert simulator.scheduler.clock_s - clock == pytest.approx(timing.decode_step_s(1))
    assert len(generation.token_ids) == 2


def test_decodes_keep_one_token_per_step_while_a_long_prompt_prefills() -> None:
    simulator = SteppedSimulator(CHUNKED)
    short = simulator.submit(GenerationRequest("short", prompt(5)))
    simulator.step()
    assert len(simulator.generations["short"].token_ids) == 1
    long = simulator.submit(GenerationRequest("long", prompt(100, start=400)))
    long_chunks = []
    while not simulator.generations["long"].deltas:
        produced = len(simulator.generations["short"].token_ids)
        clock = simulator.scheduler.clock_s
        plan = simulator.step()
        assert plan.tokens[short] == 1, "the decode spends its token first"
        long_chunks.append(plan.tokens[long])
        assert len(simulator.generations["short"].token_ids) == produced + 1, "the decode stalled"
        expected_s = simulator.timing.step_s(2, plan.tokens[long])
        assert simulator.scheduler.clock_s - clock == pytest.approx(expected_s)
    assert long_chunks == [15] * 6 + [10]


def test_a_partial_prefill_continues_before_a_new_one_starts() -> None:
    simulator = SteppedSimulator(CHUNKED)
    first = simulator.submit(GenerationRequest("first", prompt(40)))
    second = simulator.submit(GenerationRequest("second", prompt(40, start=400)))
    plan = simulator.step()
    # The budget went to the first prompt: the second has not even been admitted.
    assert plan.tokens == {first: 16}
    assert (simulator.scheduler.running, simulator.scheduler.waiting) == (1, 1)
    assert not has_started(simulator, "second")
    assert simulator.step().tokens == {first: 16}
    # The first's last 8 tokens leave 8 of the budget: the second starts.
    assert simulator.step().tokens == {first: 8, second: 8}
    assert (simulator.scheduler.running, simulator.scheduler.waiting) == (2, 0)
    assert has_started(simulator, "second")
    assert simulator.step().tokens == {first: 1, second: 15}
