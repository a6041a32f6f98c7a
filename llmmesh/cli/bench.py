"""``llmmesh bench SCENARIO``: benchmarks that measure a peer in the same run.

Progress goes to stderr while it runs; the result goes to stdout, as one
JSON object on the last line with ``--json``, else as a table. Exit status 0
when the run completed (missed targets and failed requests are reported,
not fatal), 1 when a system could not start, 130 on Ctrl-C. The systems'
logs are kept in a temporary directory when something went wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from llmmesh.bench.plan import EngineBenchPlan

SCENARIOS = ("engine",)
QUICK_CONCURRENCY = (2,)
QUICK_REQUESTS = 2  # per round
QUICK_ROUNDS = 2
QUICK_MAX_TOKENS = 16
QUICK_WARMUP = 2


def _concurrency_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return levels


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=SCENARIOS, help="what to measure")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--concurrency",
        type=_concurrency_levels,
        default=None,
        help="concurrency levels, comma-separated (default 8,32)",
    )
    parser.add_argument(
        "--requests",
        type=_positive,
        default=None,
        help="requests per system, level and round (default 4 x concurrency)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=None,
        help="rounds per system and level, run in ABBA order (default 4)",
    )
    parser.add_argument("--max-tokens", type=_positive, default=None, help="output tokens per request (128)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="warm-up requests per system, not measured (default 32)"
    )
    parser.add_argument(
        "--model-path", default="", help="Hugging Face model directory; default builds llmmesh-tiny"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: concurrency {QUICK_CONCURRENCY[0]}, {QUICK_REQUESTS} requests a round, "
        f"{QUICK_MAX_TOKENS} tokens (explicit flags still win)",
    )


def _progress(line: str) -> None:
    print(f"llmmesh bench: {line}", file=sys.stderr, flush=True)


def plan_from_args(args: argparse.Namespace) -> EngineBenchPlan:
    """The plan the flags ask for: ``--quick`` changes the defaults, explicit
    flags win over both. Raises ValueError for an impossible plan."""
    quick = bool(args.quick)
    defaults = EngineBenchPlan()
    quick_or_default = QUICK_WARMUP if quick else defaults.warmup_requests
    warmup = quick_or_default if args.warmup is None else args.warmup
    return EngineBenchPlan(
        concurrency=args.concurrency or (QUICK_CONCURRENCY if quick else defaults.concurrency),
        requests_per_level=args.requests or (QUICK_REQUESTS if quick else defaults.requests_per_level),
        rounds=args.rounds or (QUICK_ROUNDS if quick else defaults.rounds),
        max_tokens=args.max_tokens or (QUICK_MAX_TOKENS if quick else defaults.max_tokens),
        warmup_requests=warmup,
        model_path=args.model_path,
    )


def run_bench(args: argparse.Namespace) -> int:
    from llmmesh.bench.engine import EngineBench
    from llmmesh.bench.processes import StartupError

    try:
        plan = plan_from_args(args)
    except ValueError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2
    # httpx logs every request at INFO: noise here, and client work that
    # only the peer's requests would pay for.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    run_dir = Path(tempfile.mkdtemp(prefix="llmmesh-bench-"))
    keep_logs = True
    try:
        bench = EngineBench(plan, run_dir, _progress)
        report = asyncio.run(bench.run())
    except StartupError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # a --model-path without a model
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2
    else:
        errors = sum(metrics.errors for metrics in report.results.values())
        keep_logs = errors > 0
        if keep_logs:
            _progress(f"{errors} requests failed; the systems' logs are in {run_dir}")
    finally:
        if not keep_logs:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(report.to_json() if args.json else report.to_table(), flush=True)
    return 0
