"""The simulator's next-token distribution: sampling agrees with the log
probabilities it reports, greedy takes the argmax, bias and penalties move
probability as vLLM's would."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.engine.sim.distribution import MARK_LOGIT, Adjustments, Pool, sample

POOL = Pool.of(list(range(100, 120)))
OUTSIDE = 7


def frequencies(draws: int, **kwargs: object) -> Counter[int]:
    """How often each token is sampled over an even grid of draws."""
    return Counter(sample(POOL, (i + 0.5) / draws, **kwargs).token_id for i in range(draws))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"marks": {105: MARK_LOGIT / 10}},
        {"adjustments": Adjustments({101: 1.5, 102: -2.0, OUTSIDE: 12.0}), "temperature": 0.7},
        {"adjustments": Adjustments({}, 0.5, 0.75), "counts": {103: 2, 104: 1}, "temperature": 1.3},
    ],
)
def test_sampling_frequencies_follow_the_reported_probabilities(kwargs: dict[str, object]) -> None:
    kwargs.setdefault("temperature", 1.0)
    draws = 20_000
    seen = frequencies(draws, **kwargs)
    top = sample(POOL, 0.5, top=len(POOL.ids) + 2, **kwargs).top  # type: ignore[arg-type]
    probabilities = {candidate: math.exp(logprob) for candidate, logprob in top}
    for token_id, probability in probabilities.items():
        assert abs(seen[token_id] / draws - probability) < 0.01, token_id
    assert abs(sum(probabilities.values()) - 1.0) < 1e-9


def test_greedy_takes_the_argmax_and_breaks_ties_with_the_draw() -> None:
    assert {sample(POOL, u / 10).token_id for u in range(10)} <= set(POOL.ids)
    assert len({sample(POOL, u / 10).token_id for u in range(10)}) == 10
    favoured = Adjustments({113: 0.01})
    assert {sample(POOL, u / 10, adjustments=favoured).token_id for u in range(10)} == {113}
    assert sample(POOL, 0.3, marks={5: MARK_LOGIT}).token_id == 5


def test_a_ban_removes_a_token_and_a_large_bias_brings_one_in() -> None:
    banned = Adjustments(dict.fromkeys(POOL.ids[:19], -100.0))
    assert {
        sample(POOL, (u + 0.5) / 50, adjustments=banned, temperature=1.0).token_id for u in range(50)
    } == {119}
    assert sample(POOL, 0.99, adjustments=Adjustments({OUTSIDE: 100.0}), temperature=1.0).token_id == OUTSIDE
    rare = sample(POOL, 0.5, adjustments=Adjustments({OUTSIDE: 2.0}), temperature=1.0, top=21)
    assert dict(rare.top)[OUTSIDE] < math.log(1e-3)


def test_penalties_lower_the_logits_of_tokens_already_out() -> None:
    counts = {100: 3, 101: 1}
    result = sample(
        POOL, 0.5, adjustments=Adjustments({}, 0.5, 1.0), counts=counts, temperature=1.0, top=len(POOL.ids)
    )
    logprobs = dict(result.top)
    assert logprobs[101] == pytest.approx(logprobs[102] - 1.5)
    assert logprobs[100] == pytest.approx(logprobs[102] - 3.5)
    greedy = {
        sample(POOL, u / 20, adjustments=Adjustments({}, 0.1), counts=counts).token_id for u in range(20)
    }
    assert not greedy & {100, 101}


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0, 1, exclude_min=True, exclude_max=True),
    st.dictionaries(st.integers(0, 130), st.floats(-100, 100), max_size=6),
    st.sampled_from([None, 0.2, 1.0, 2.0]),
    st.integers(0, 20),
    st.integers(1, 20),
)
def test_samples_are_candidates_and_top_lists_are_sorted(
    u: float, bias: dict[int, float], temperature: float | None, top: int, size: int
) -> None:
    pool = POOL.sized(size)
    result = sample(pool, u, adjustments=Adjustments(bias), temperature=temperature, top=top)
    assert result.token_id in pool or result.token_id in bias
    assert result.logprob <= 1e-12
    assert len(result.top) == min(top, len(set(pool.ids[:size]) | set(bias)))
    assert [logprob for _, logprob in result.top] == sorted((lp for _, lp in result.top), reverse=True)
    if result.top and temperature is None:
        assert result.logprob == pytest.approx(result.top[0][1])


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0, 1, exclude_min=True, exclude_max=True),
    st.sampled_from([None, {5: MARK_LOGIT}, {5: 0.5}, {5: -1.0}, {101: 3.0}, {5: 2.0, 6: 1.0}]),
    st.sampled_from([None, 0.3, 1.0, 4.0]),
)
def test_the_plain_text_shortcut_agrees_with_the_general_path(
    u: float, marks: dict[int, float] | None, temperature: float | None
) -> None:
    """Plain free text skips the general computation; asking for a top list
    takes the general one, which must agree on the token and its logprob."""
    fast = sample(POOL, u, marks=marks, temperature=temperature)
    general = sample(POOL, u, marks=marks, temperature=temperature, top=1)
    assert fast.token_id == general.token_id
    assert fast.logprob == pytest.approx(general.logprob)


@pytest.mark.parametrize("temperature", [None, 1.0, 0.5])
def test_the_chosen_word_is_listed_when_it_ties_the_last_top_entry(temperature: float | None) -> None:
    """Every pool word is equally likely: whichever is drawn, late in the
    pool or not, the top list has it, with its own log probability."""
    for step in range(20):
        result = sample(POOL, (step + 0.5) / 20, temperature=temperature, top=3)
        listed = dict(result.top)
        assert len(result.top) == 3
        assert listed[result.token_id] == pytest.approx(result.logprob)
        assert result.top[-1][1] == pytest.approx(result.logprob)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0, 1, exclude_min=True, exclude_max=True),
    st.dictionaries(st.integers(0, 130), st.sampled_from([-1.0, 0.0, 1.0, 50.0]), max_size=6),
    st.dictionaries(st.integers(95, 125), st.integers(1, 3), max_size=4),
    st.sampled_from([None, 0.5, 1.0]),
    st.integers(1, 6),
)
def test_the_chosen_token_is_listed_whenever_it_is_among_the_likeliest(
    u: float, bias: dict[int, float], counts: dict[int, int], temperature: float | None, top: int
) -> None:
    """Ties (equal biases, equal penalties, the plain words) never push the
    chosen token out of a top list it belongs to by probability."""
    result = sample(
        POOL, u, adjustments=Adjustments(bias, 0.5), counts=counts, temperature=temperature, top=top
    )
    if len(result.top) < top or result.logprob >= result.top[-1][1] - 1e-12:
        assert result.token_id in dict(result.top)
