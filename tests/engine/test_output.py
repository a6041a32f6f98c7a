"""Deterministic output, resumed generations and stop sequences, run through
the simulator backend end to end (no gRPC)."""

from __future__ import annotations

import pytest

from llmmesh.engine.backend import FinishReason, GenerationRequest, SamplingOptions
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.detokenizer import StopAwareDetokenizer
from llmmesh.engine.sim.tokenizer import SimTokenizer
from tests.engine.support import collect

PROMPT = tuple(SimTokenizer().encode_prompt("tell me about the sea and the mountain"))


def request(request_id: str, **kwargs: object) -> GenerationRequest:
    sampling = kwargs.pop("sampling", SamplingOptions())
    assert isinstance(sampling, SamplingOptions)
    return GenerationRequest(request_id, PROMPT, sampling, **kwargs)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_same_prompt_and_seed_give_the_same_reply(backend: SimBackend) -> None:
    seeded = SamplingOptions(temperature=0.8, seed=7)
    first = await collect(backend, request("a", sampling=seeded))
    second = await collect(backend, request("b", sampling=seeded))
    other_seed = await collect(backend, request("c", sampling=SamplingOptions(temperature=0.8, seed=8)))
    assert first.token_ids == second.token_ids and first.text == second.text
    assert first.token_ids != other_seed.token_ids
    assert first.finished is not None and first.finished.reason is FinishReason.STOP
    assert 12 <= first.finished.output_tokens <= 80
    assert first.text.endswith(".")
    assert first.text == backend.tokenizer.decode(first.token_ids)


@pytest.mark.asyncio
async def test_greedy_decoding_ignores_the_seed(backend: SimBackend) -> None:
    plain = await collect(backend, request("a"))
    seeded = await collect(backend, request("b", sampling=SamplingOptions(temperature=0.0, seed=99)))
    assert plain.token_ids == seeded.token_ids


@pytest.mark.asyncio
@pytest.mark.parametrize("resume_at", [1, 5, 11])
async def test_a_resumed_generation_continues_the_uninterrupted_one(
    backend: SimBackend, resume_at: int
) -> None:
    whole = await collect(backend, request("whole"))
    resumed_ids = tuple(whole.token_ids[:resume_at])
    rest = await collect(backend, request("rest", resume_output_token_ids=resumed_ids))
    assert rest.token_ids == whole.token_ids[resume_at:]
    assert backend.tokenizer.decode(resumed_ids) + rest.text == whole.text
    assert [d.output_token_offset for d in rest.deltas] == list(range(resume_at, len(whole.token_ids)))
    assert rest.finished is not None and whole.finished is not None
    assert rest.finished.reason is whole.finished.reason
    assert rest.finished.output_tokens == len(whole.token_ids) - resume_at
    assert rest.started is not None and rest.started.prompt_tokens == len(PROMPT) + resume_at


@pytest.mark.asyncio
async def test_max_tokens_counts_resumed_tokens(backend: SimBackend) -> None:
    whole = await collect(backend, request("whole"))
    limited = SamplingOptions(max_tokens=8)
    rest = await collect(
        backend, request("rest", sampling=limited, resume_output_token_ids=tuple(whole.token_ids[:5]))
    )
    assert rest.token_ids == whole.token_ids[5:8]
    assert rest.finished is not None and rest.finished.reason is FinishReason.LENGTH
    done = await collect(
        backend, request("done", sampling=limited, resume_output_token_ids=tuple(whole.token_ids[:8]))
    )
    assert done.token_ids == [] and done.finished is not None
    assert done.finished.reason is FinishReason.LENGTH


@pytest.mark.asyncio
async def test_the_context_window_ends_a_reply(backend: SimBackend) -> None:
    window = backend.info().context_window
    long_prompt = tuple(backend.tokenizer.encode(" the" * (window - 3)))
    reply = await collect(backend, GenerationRequest("long", long_prompt))
    assert len(reply.token_ids) == 3
    assert reply.finished is not None and reply.finished.reason is FinishReason.LENGTH


@pytest.mark.asyncio
@pytest.mark.parametrize(("start", "length"), [(6, 4), (3, 9), (20, 2)])
async def test_stop_sequences_cut_the_text_before_them(backend: SimBackend, start: int, length: int) -> None:
    whole = await collect(backend, request("whole"))
    stop = whole.text[start : start + length]
    cut = await collect(backend, request("cut", sampling=SamplingOptions(stop=("never seen", stop))))
    assert cut.text == whole.text[: whole.text.find(stop)]
    assert cut.finished is not None
    assert cut.finished.reason is FinishReason.STOP and cut.finished.matched_stop == stop
    assert stop not in cut.text


def test_text_that_could_start_a_stop_is_held_back() -> None:
    tokenizer = SimTokenizer()
    detokenizer = StopAwareDetokenizer(tokenizer, ["the end"], [])
    # Six characters (the stop's length minus one) wait until they are safe.
    assert detokenizer.push(tokenizer.piece_id(" once")) == ""
    assert detokenizer.push(tokenizer.piece_id(" the")) == " on"
    assert detokenizer.push(tokenizer.piece_id(" end")) == "ce "
    assert detokenizer.matched_stop == "the end"


def test_a_stop_may_begin_in_resumed_text() -> None:
    tokenizer = SimTokenizer()
    detokenizer = StopAwareDetokenizer(tokenizer, ["the end"], tokenizer.encode(" at the"))
    assert detokenizer.push(tokenizer.piece_id(" end")) == ""
    assert detokenizer.matched_stop == "the end"


@pytest.mark.asyncio
async def test_ignore_eos_runs_past_the_natural_end_to_max_tokens(backend: SimBackend) -> None:
    natural = await collect(backend, request("a"))
    assert natural.finished is not None and natural.finished.reason is FinishReason.STOP
    longer = natural.finished.output_tokens + 40
    forced = await collect(
        backend, request("b", sampling=SamplingOptions(max_tokens=longer, ignore_eos=True))
    )
    assert forced.finished is not None and forced.finished.reason is FinishReason.LENGTH
    assert forced.finished.output_tokens == longer
    # The same words (the last few differ: no closing stop is placed near the natural end), then more.
    shared = len(natural.token_ids) - 3
    assert forced.token_ids[:shared] == natural.token_ids[:shared]
