"""The command line of ``llmmesh bench fleet``: its flags and its plan.

``--requests`` is the number of turns in the workload, ``--rate`` the
turns sent per second, ``--rounds`` how often each system sends the whole
workload, ``--warmup`` the unmeasured turns each system sends first,
``--max-tokens`` the reply budget of every turn; ``--quick`` is a smoke run
(12 turns, one round, 32 tokens). Explicit flags win over ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmmesh.bench.fleet import FleetBench, FleetBenchPlan
from llmmesh.bench.fleet_workload import FleetWorkload

QUICK = FleetBenchPlan(workload=FleetWorkload(turns=12, chat_max_tokens=32, hard_max_tokens=32), rounds=1)


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to 1, got {text!r}")
    return value


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet scenario")
    fleet.add_argument(
        "--chat-share", type=_share, default=None, help="share of chit-chat turns in the workload (0.7)"
    )
    fleet.add_argument("--pods-per-model", type=int, default=None, help="simulator pods per model (1)")
    fleet.add_argument("--seed", type=int, default=None, help="the workload's seed")
    fleet.add_argument("--rate", type=float, default=None, help="turns sent per second, Poisson arrivals (2)")


def fleet_plan_from_args(args: argparse.Namespace) -> FleetBenchPlan:
    """The plan the flags ask for; ValueError for an impossible one."""
    base = QUICK if args.quick else FleetBenchPlan()
    workload = base.workload
    changes: dict[str, Any] = {}
    if args.requests is not None:
        changes["turns"] = args.requests
    if args.max_tokens is not None:
        changes["chat_max_tokens"] = changes["hard_max_tokens"] = args.max_tokens
    if args.chat_share is not None:
        changes["chat_share"] = args.chat_share
    if args.seed is not None:
        changes["seed"] = args.seed
    plan_changes: dict[str, Any] = {"workload": dataclasses.replace(workload, **changes)}
    if args.rate is not None:
        plan_changes["rate"] = args.rate
    if args.warmup is not None:
        plan_changes["warmup"] = args.warmup
    if args.rounds is not None:
        plan_changes["rounds"] = args.rounds
    if args.pods_per_model is not None:
        plan_changes["pods_per_model"] = args.pods_per_model
    return dataclasses.replace(base, **plan_changes)


def run_fleet(args: argparse.Namespace, progress: Callable[[str], None], run_scenario: Any) -> int:
    """Run the scenario through the bench command's ``run_scenario``."""
    import sys

    try:
        plan = fleet_plan_from_args(args)
    except ValueError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2

    def fleet(run_dir: Path) -> tuple[Any, str | None]:
        report = asyncio.run(FleetBench(plan, run_dir, progress).run())
        errors = sum(r.metrics()["errors"] for r in report.results.values())  # type: ignore[misc]
        return report, f"{errors} turns failed" if errors else None

    result: int = run_scenario(args, fleet, "llmmesh-bench-fleet-")
    return result
