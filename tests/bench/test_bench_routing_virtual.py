"""The routing guard: the reference scenario of ``llmmesh bench routing``
(4 simulator pods, 70% KV pressure, tenants' chats over shared system
prompts) in virtual time, its targets asserted on figures that depend on
the seed alone, never on the machine; and the pieces it stands on (the
virtual clock, in-process gRPC, the oracle)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import grpc.aio
import pytest

from llmmesh.bench.inprocess_grpc import InProcessServer
from llmmesh.bench.plan import SIM_ROUTING
from llmmesh.bench.routing import sim_workload
from llmmesh.bench.routing_oracle import oracle_hit_rates
from llmmesh.bench.routing_report import RoutingReport, RoutingTargets, system_name
from llmmesh.bench.routing_virtual import VirtualSpec, run_system, run_systems
from llmmesh.bench.routing_workload import ConversationWorkload
from llmmesh.bench.virtual_clock import VirtualClockStalled, run_virtual
from llmmesh.cli.bench import routing_plan_from_args
from llmmesh.cli.main import build_parser
from llmmesh.engine.servicer import EngineServicer
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

MODEL = EngineSettings().model


def _reference() -> tuple[VirtualSpec, ConversationWorkload]:
    plan = SIM_ROUTING
    workload, _, kv_blocks = sim_workload(plan)
    spec = VirtualSpec(
        plan.pods, kv_blocks, plan.block_size, plan.max_num_seqs, EngineSettings().context_window
    )
    return spec, workload


def test_the_reference_scenario_meets_its_targets_and_repeats_to_the_digit() -> None:
    plan = SIM_ROUTING
    spec, workload = _reference()
    policies = ("precise", "approximate", "round_robin")
    systems = run_virtual(
        run_systems(policies, (), spec, workload, plan.concurrency, plan.warmup_per_tenant, MODEL)
    )
    assert all(result.metrics.errors == 0 for result in systems.values())
    targets = RoutingTargets()
    precise, approximate = systems[system_name("precise")], systems[system_name("approximate")]
    round_robin = systems[system_name("round_robin")]
    assert precise.metrics.ttft_p90_s is not None and round_robin.metrics.ttft_p90_s is not None
    ratio = round_robin.metrics.ttft_p90_s / precise.metrics.ttft_p90_s
    assert ratio >= targets.sim_virtual_round_robin_over_precise_min, ratio
    assert precise.prefix.hit_rate is not None and approximate.prefix.hit_rate is not None
    assert precise.prefix.hit_rate >= approximate.prefix.hit_rate
    # Precise reaches most of what any placement could on this trace.
    share = precise.extras["hit_rate_share_of_oracle"]
    assert isinstance(share, float) and share >= 0.9
    again = run_virtual(
        run_system("precise", spec, workload, plan.concurrency, plan.warmup_per_tenant, MODEL)
    )
    assert again.result.as_dict() == precise.as_dict()
    report = RoutingReport(MODEL, "virtual", None, None, clock="virtual")
    assert report.as_dict()["clock"] == "virtual"


def test_the_virtual_clock_jumps_to_the_next_timer() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600.0)
        slept = loop.time()
        async with asyncio.timeout(0.25):
            await asyncio.sleep(0.1)
        return slept, loop.time()

    assert run_virtual(main()) == (3600.0, 3600.1)


def test_a_loop_where_nothing_can_ever_wake_is_reported() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualClockStalled):
        run_virtual(main(), stall_s=0.01)


def test_in_process_grpc_reports_an_abort_as_a_real_channel_does() -> None:
    async def main() -> tuple[grpc.StatusCode, bool]:
        backend = SimBackend(EngineSettings())
        server = InProcessServer()
        engine_service_pb2_grpc.add_EngineServiceServicer_to_server(EngineServicer(backend, 500), server)
        stub = engine_service_pb2_grpc.EngineServiceStub(server.channel())
        try:
            await stub.GetTokenizer(
                engine_service_pb2.GetTokenizerRequest(model="another-model"), timeout=1.0
            )
        except grpc.aio.AioRpcError as err:
            # The rich status travels in the trailing metadata, as on the wire.
            details = any(key == "grpc-status-details-bin" for key, _ in err.trailing_metadata() or ())
            return err.code(), details
        raise AssertionError("no error")

    assert run_virtual(main()) == (grpc.StatusCode.NOT_FOUND, True)


def test_the_oracle_counts_the_reuse_any_placement_could_reach() -> None:
    a = list(range(8))
    b = [*range(4), 100, 101, 102, 103]
    # Blocks of 4: the second prompt hits a's first block (4 of 8 tokens),
    # the third (a again) all but its last block (never its last token).
    rates = oracle_hit_rates([a, b, a], [True, True, True], capacity_blocks=100, block_size=4)
    assert rates.infinite == rates.pooled_lru == pytest.approx((0 + 4 + 4) / 24)
    # A cache of one block keeps only the last prompt's last block.
    tight = oracle_hit_rates([a, b, a], [False, True, True], capacity_blocks=1, block_size=4)
    assert tight.pooled_lru == 0.0 and tight.infinite == pytest.approx(8 / 16)


def small_run() -> str:
    """Two regions of two pods, a few turns: the figures as sorted JSON."""
    plan = dataclasses.replace(SIM_ROUTING, tenants=4, conversations_per_tenant=2, turns_per_conversation=2)
    workload, _, kv_blocks = sim_workload(plan)
    spec = VirtualSpec(4, kv_blocks, plan.block_size, plan.max_num_seqs, EngineSettings().context_window, 2)
    run = run_virtual(run_system("precise", spec, workload, 4, 0, MODEL))
    return json.dumps(run.result.as_dict(), sort_keys=True)


def test_a_virtual_run_splits_pods_over_regions_the_same_in_any_process() -> None:
    here = small_run()
    result = json.loads(here)
    assert result["requests"] == 16 and result["errors"] == 0
    # Another process hashes strings and bytes with another seed: set and
    # dict orders differ there, the figures must not.
    child = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import small_run; print(small_run())"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert child.stdout.strip().splitlines()[-1] == here


def test_pods_cannot_be_split_over_more_regions_than_pods() -> None:
    with pytest.raises(ValueError, match="cannot be split"):
        VirtualSpec(1, 100, 16, 8, 4096, 2)


def test_the_command_line_runs_the_simulator_in_virtual_time_unless_told_otherwise() -> None:
    parse = build_parser().parse_args
    default = routing_plan_from_args(parse(["bench", "routing"]))
    assert default.clock == "virtual" and default.sim is not None and default.vllm is not None
    # Virtual time asked for by name: the simulator only (vLLM runs in real time).
    virtual = routing_plan_from_args(parse(["bench", "routing", "--clock", "virtual"]))
    assert virtual.sim is not None and virtual.vllm is None
    real = routing_plan_from_args(parse(["bench", "routing", "--clock", "real", "--backend", "sim"]))
    assert real.clock == "real" and real.vllm is None
    scale = routing_plan_from_args(
        parse(
            ["bench", "routing", "--clock", "virtual", "--pods", "64", "--regions", "4", "--workload", "rag"]
        )
    )
    assert scale.regions == 4 and scale.sim is not None and scale.sim.workload == "rag"
    with pytest.raises(ValueError, match="virtual time only"):
        routing_plan_from_args(parse(["bench", "routing", "--clock", "real", "--regions", "2"]))
