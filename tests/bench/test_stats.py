"""Percentiles, per-request timing and the metrics of a level."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.bench.stats import RequestRecord, percentile, summarize

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=1, max_size=200)
quantiles = st.floats(min_value=0.0, max_value=100.0)


def test_percentile_interpolates_like_numpy() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0) == 15.0
    assert percentile(values, 50) == 35.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 40) == pytest.approx(29.0)  # rank 1.6: 20 + 0.6 * 15
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)


def test_percentile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0], 101)


@given(samples, quantiles)
def test_percentile_lies_within_the_values(values: list[float], q: float) -> None:
    assert min(values) <= percentile(values, q) <= max(values)


@given(samples, quantiles, quantiles)
def test_percentile_is_monotone_in_q(values: list[float], q1: float, q2: float) -> None:
    low, high = sorted((q1, q2))
    assert percentile(values, low) <= percentile(values, high)


@given(samples, quantiles)
def test_percentile_ignores_order(values: list[float], q: float) -> None:
    assert percentile(values, q) == percentile(list(reversed(values)), q)


@given(samples)
def test_percentile_ends_are_min_and_max(values: list[float]) -> None:
    assert percentile(values, 0) == min(values)
    assert percentile(values, 100) == max(values)


@given(finite, st.integers(min_value=1, max_value=50), quantiles)
def test_percentile_of_a_constant_is_the_constant(value: float, count: int, q: float) -> None:
    assert percentile([value] * count, q) == value


def test_ttft_is_sent_to_first_token() -> None:
    record = RequestRecord(sent_at=10.0)
    assert record.ttft_s is None
    record.add_tokens(10.5, 0)  # a role-only chunk carries no token
    record.add_tokens(10.25 + 0.5, 1)
    assert record.ttft_s == pytest.approx(0.75)


def test_itl_spreads_a_chunk_over_its_tokens() -> None:
    record = RequestRecord(sent_at=0.0)
    record.add_tokens(1.0, 2)  # first chunk: TTFT, no ITL samples even for its second token
    record.add_tokens(1.1, 1)
    record.add_tokens(1.4, 3)  # 0.3 s for 3 tokens: 0.1 three times
    record.add_tokens(1.6, 0)
    record.add_tokens(2.0, 4)  # 0.6 s for 4 tokens
    assert record.output_tokens == 10
    assert record.itl_samples() == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.15, 0.15, 0.15, 0.15])


def test_a_record_keeps_its_first_error() -> None:
    record = RequestRecord(sent_at=0.0)
    record.finish(1.0)
    assert record.ok
    record.fail("first")
    record.fail("second")
    assert record.error == "first"
    assert not record.ok


def _record(sent: float, arrivals: list[float], error: str | None = None) -> RequestRecord:
    record = RequestRecord(sent_at=sent)
    for at in arrivals:
        record.add_tokens(at, 1)
    if error is None:
        record.finish(arrivals[-1])
    else:
        record.fail(error)
    return record


def test_summary_of_a_level() -> None:
    records = [
        _record(0.0, [0.1, 0.2, 0.3]),
        _record(0.0, [0.3, 0.5, 0.7]),
        _record(0.5, [0.6], error="UNAVAILABLE: pod gone"),
    ]
    metrics = summarize(records, wall_s=2.0)
    assert metrics.requests == 3
    assert metrics.errors == 1
    assert metrics.output_tokens == 7  # the failed request's token counts as delivered
    assert metrics.output_tok_s == pytest.approx(3.5)
    assert metrics.ttft_p50_s == pytest.approx(0.2)  # failed requests give no latency samples
    assert metrics.ttft_p90_s == pytest.approx(0.28)
    assert metrics.itl_p50_s == pytest.approx(0.15)  # samples 0.1, 0.1, 0.2, 0.2


def test_summary_without_tokens_has_no_latencies() -> None:
    metrics = summarize([_record(0.0, [0.0], error="refused")], wall_s=0.0)
    assert metrics.errors == 1
    assert metrics.ttft_p50_s is None
    assert metrics.itl_p50_s is None
    assert metrics.output_tok_s == 0.0
    assert all(not isinstance(v, float) or math.isfinite(v) for v in metrics.as_dict().values())
