"""``llmmesh bench fleet``: the seeded workload, the report's ratios and
targets, the plan from the flags, and one small run through a real fleet."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from llmmesh.bench.fleet import fleet_toml
from llmmesh.bench.fleet_cli import fleet_plan_from_args
from llmmesh.bench.fleet_report import FleetReport, SystemResult, TurnResult
from llmmesh.bench.fleet_workload import CHAT, HARD, FleetWorkload
from llmmesh.cli.bench import add_bench_arguments
from llmmesh.region.modelchoice.difficulty import LARGE, SMALL, RuleScorer, features_of
from llmmesh.topology.mesh_config import parse_mesh_config
from llmmesh.v1 import common_pb2


def test_the_workload_is_seeded_and_its_kinds_score_as_meant() -> None:
    workload = FleetWorkload(turns=40)
    turns = workload.generate()
    assert turns == workload.generate()
    assert {t.kind for t in turns} == {CHAT, HARD}
    scorer = RuleScorer()
    for turn in turns:
        message = common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=turn.prompt)
        tier = scorer.score(features_of([message], common_pb2.TIER_PRO, None)).tier
        assert tier == (SMALL if turn.kind == CHAT else LARGE) or tier > LARGE, turn.prompt


def test_the_report_has_ratios_and_targets() -> None:
    def system(model: str, cost: str, ttft: float) -> SystemResult:
        return SystemResult([TurnResult(CHAT, ttft, model, "difficulty", Decimal(cost)) for _ in range(10)])

    report = FleetReport(
        {"turns": 10},
        {
            "auto": system("llmmesh-small", "0.0005", 0.1),
            "always_large": system("llmmesh-large", "0.001", 0.2),
            "always_small": system("llmmesh-small", "0.0001", 0.1),
        },
    )
    data = json.loads(report.to_json())
    assert data["scenario"] == "fleet"
    assert data["ratios"] == {"auto_cost_vs_large": 0.5, "auto_ttft_p90_vs_large": 0.5}
    assert data["targets"] == {
        "cost_at_least_40pct_lower_than_large": True,
        "ttft_p90_no_worse_than_large": True,
    }
    assert data["results"]["auto"]["share_by_model"] == {"llmmesh-small": 1.0}
    assert "always_large" in report.to_table()


def test_the_plan_follows_the_flags_and_the_topology_is_a_fleet() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    plan = fleet_plan_from_args(parser.parse_args(["fleet", "--quick", "--requests", "5", "--rate", "3"]))
    assert (plan.workload.turns, plan.rate, plan.rounds, plan.workload.chat_max_tokens) == (5, 3.0, 1, 32)
    region = next(parse_mesh_config(fleet_toml(2)).regions())
    assert [m for _, m in region.pod_models()] == ["llmmesh-small"] * 2 + ["llmmesh-large"] * 2
    with pytest.raises(ValueError, match="rate"):
        fleet_plan_from_args(parser.parse_args(["fleet", "--rate", "0"]))


@pytest.mark.e2e
def test_a_small_run_through_a_real_fleet(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "llmmesh",
        "bench",
        "fleet",
        "--quick",
        "--json",
        "--log-dir",
        str(tmp_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(data["results"]) == {"auto", "always_large", "always_small"}
    assert all(r["errors"] == 0 for r in data["results"].values())
    assert set(data["results"]["auto"]["share_by_model"]) == {"llmmesh-small", "llmmesh-large"}
    assert data["results"]["always_large"]["share_by_model"] == {"llmmesh-large": 1.0}
    assert data["ratios"]["auto_cost_vs_large"] < 1.0
