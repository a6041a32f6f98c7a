"""Ratios, targets and the JSON report."""

from __future__ import annotations

import json

import pytest

from llmmesh.bench.report import BenchReport, Targets, compare, ratio
from llmmesh.bench.stats import LevelMetrics


def metrics(output_tok_s: float, ttft_p50_s: float | None, itl_p50_s: float | None = 0.01) -> LevelMetrics:
    return LevelMetrics(
        requests=32,
        errors=0,
        output_tokens=4096,
        wall_s=4096 / output_tok_s,
        output_tok_s=output_tok_s,
        ttft_p50_s=ttft_p50_s,
        ttft_p90_s=None if ttft_p50_s is None else ttft_p50_s * 2,
        ttft_p99_s=None if ttft_p50_s is None else ttft_p50_s * 3,
        itl_p50_s=itl_p50_s,
    )


def test_ratio_is_ours_over_peer() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_compare_covers_throughput_and_latencies() -> None:
    ratios = compare(metrics(90.0, 0.2, 0.02), metrics(100.0, 0.1, 0.01))
    assert ratios == pytest.approx(
        {"output_tok_s": 0.9, "ttft_p50_s": 2.0, "ttft_p90_s": 2.0, "itl_p50_s": 2.0}
    )


@pytest.mark.parametrize(
    ("throughput", "ttft", "met"),
    [
        (0.95, 1.1, True),
        (1.2, 0.5, True),
        (0.94, 1.0, False),
        (1.0, 1.11, False),
        (None, 1.0, False),
        (1.0, None, False),
    ],
)
def test_targets(throughput: float | None, ttft: float | None, met: bool) -> None:
    assert Targets().met({"output_tok_s": throughput, "ttft_p50_s": ttft}) is met


def _report() -> BenchReport:
    return BenchReport(
        scenario="engine",
        model="llmmesh-tiny",
        ours="llmmesh",
        peer="vllm-serve",
        levels=["c8", "c32"],
        results={
            "llmmesh/c8": metrics(100.0, 0.1),
            "vllm-serve/c8": metrics(100.0, 0.1),
            "llmmesh/c32": metrics(80.0, 0.3),
            "vllm-serve/c32": metrics(100.0, None),
        },
    )


def test_the_json_report_has_missions_shape() -> None:
    line = _report().to_json()
    assert "\n" not in line
    report = json.loads(line)
    assert list(report) == ["scenario", "model", "results", "ratios", "targets", "targets_met"]
    assert report["scenario"] == "engine"
    assert list(report["results"]) == ["llmmesh/c8", "vllm-serve/c8", "llmmesh/c32", "vllm-serve/c32"]
    assert set(report["results"]["llmmesh/c8"]) >= {
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "itl_p50_s",
        "output_tok_s",
        "requests",
        "output_tokens",
        "errors",
    }
    assert report["ratios"]["c8"] == {
        "output_tok_s": 1.0,
        "ttft_p50_s": 1.0,
        "ttft_p90_s": 1.0,
        "itl_p50_s": 1.0,
    }
    assert report["ratios"]["c32"]["ttft_p50_s"] is None
    assert report["ratios"]["c32"]["output_tok_s"] == 0.8
    assert report["targets"] == {"output_tok_s_ratio_min": 0.95, "ttft_p50_ratio_max": 1.1}
    assert report["targets_met"] == {"c8": True, "c32": False}


def test_the_table_shows_every_result_and_level() -> None:
    table = _report().to_table()
    for key in ("llmmesh/c8", "vllm-serve/c32", "ratios llmmesh / vllm-serve", "targets met"):
        assert key in table


def test_a_missing_result_is_refused() -> None:
    with pytest.raises(ValueError, match="vllm-serve/c8"):
        BenchReport("engine", "m", "llmmesh", "vllm-serve", ["c8"], {"llmmesh/c8": metrics(1.0, 0.1)})
