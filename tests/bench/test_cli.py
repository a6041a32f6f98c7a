"""``llmmesh bench`` flags and the plan they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmmesh.bench.engine import EngineBench
from llmmesh.bench.plan import EngineBenchPlan
from llmmesh.cli.bench import plan_from_args
from llmmesh.cli.main import build_parser


def _plan(*flags: str) -> EngineBenchPlan:
    return plan_from_args(build_parser().parse_args(["bench", "engine", *flags]))


def test_defaults() -> None:
    plan = _plan()
    assert plan == EngineBenchPlan()
    assert plan.concurrency == (8, 32)
    assert [plan.requests_at(c) for c in plan.concurrency] == [32, 128]
    assert plan.max_tokens == 128


def test_quick() -> None:
    plan = _plan("--quick")
    assert plan.concurrency == (2,)
    assert (plan.requests_at(2), plan.rounds) == (2, 2)
    assert plan.max_tokens == 16


def test_explicit_flags_win() -> None:
    plan = _plan(
        "--quick",
        "--concurrency",
        "1,3",
        "--requests",
        "5",
        "--max-tokens",
        "7",
        "--warmup",
        "0",
        "--rounds",
        "3",
    )
    assert plan.concurrency == (1, 3)
    assert plan.rounds == 3
    assert plan.requests_at(3) == 5
    assert plan.max_tokens == 7
    assert plan.warmup_requests == 0


@pytest.mark.parametrize("levels", ["0", "8,x", ""])
def test_bad_concurrency_is_refused(levels: str) -> None:
    with pytest.raises(SystemExit):
        _plan("--concurrency", levels)


def test_a_run_is_ours_then_the_peer_then_ours_again(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")

    def sessions(rounds: int, speculative: str = "") -> list[tuple[str, range]]:
        plan = EngineBenchPlan(rounds=rounds, model_path=str(tmp_path), speculative=speculative)
        return [(system, turns) for system, turns in EngineBench(plan, tmp_path, print).sessions() if turns]

    assert sessions(4) == [("llmmesh", range(2)), ("vllm-serve", range(4)), ("llmmesh", range(2, 4))]
    assert sessions(3) == [("llmmesh", range(2)), ("vllm-serve", range(3)), ("llmmesh", range(2, 3))]
    # One round: each system starts once.
    assert sessions(1) == [("llmmesh", range(1)), ("vllm-serve", range(1))]
    speculating = [("llmmesh-spec", range(1)), ("llmmesh", range(2)), ("llmmesh-spec", range(1, 2))]
    assert sessions(2, "ngram") == speculating
