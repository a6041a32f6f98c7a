"""``llmmesh bench overhead``: what the mesh adds over the engine.

The mesh runs as ``llmmesh up`` runs it, every plane its own process
(:mod:`llmmesh.bench.overhead_systems`): a global plane, one simulator
engine pod with fixed step costs (:class:`~llmmesh.bench.overhead_plan.SimTiming`:
no batch slowdown, no jitter, a prefill cost independent of the prompt),
one region with its safety filters on (the product path; ``--safety off``
measures without them) and one edge. Two systems share that one pod:

- ``direct``: the benchmark on the pod's ``EngineService.Generate`` gRPC
  stream; time to first token ends at the first ``delta`` event;
- ``mesh``: the benchmark on the edge's streamed ``POST
  /v1/chat/completions`` (edge → region → the same pod); time to first
  token ends at the first chunk with content, not the role chunk.

Both send the same requests (the seeded chat workload, greedy, the same
``max_tokens``) at each concurrency level in a closed loop. ``ignore_eos``
makes every reply ``max_tokens`` long; a first probe checks that the whole
mesh path honours it, and where it does not, both systems run without it:
the simulator's reply length is then a function of the prompt, which both
send alike, so replies still match one for one (the report counts any that
do not). Each level runs in rounds, the systems alternating ABBA, after a
warm-up of each at the busiest level; a system's figures pool its rounds.

Each request is sent after a seeded random delay of up to one decode step,
outside its TTFT. Without it, a closed loop sends each request right after
the step that ended the previous one, so requests reach a busy pod at a
fixed phase of its step cycle set by the path's own latency, and the wait
for the next step boundary would hide part of what the path adds (a
request that arrives later waits less). Independent users arrive at random
phases; the delay restores that, and costs both systems the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from engine.settings import EngineSettings
from engine.sim.sampler import MAX_REPLY_TOKENS
from llmmesh.bench.grpc_client import EngineGrpcClient
from llmmesh.bench.loadgen import LevelRun, StreamingClient, measure_level, run_closed_loop
from llmmesh.bench.overhead_clients import ArrivalJitter, SimChunkCounter
from llmmesh.bench.overhead_plan import OverheadBenchPlan
from llmmesh.bench.overhead_report import DIRECT, MESH, SYSTEMS, OverheadReport, PathMetrics, key
from llmmesh.bench.overhead_sse import SseChatClient
from llmmesh.bench.overhead_systems import KV_BLOCKS, running_mesh
from llmmesh.bench.processes import StartupError
from llmmesh.bench.routing_systems import API_KEY
from llmmesh.bench.workload import ChatWorkload

Progress = Callable[[str], None]

MEASURED = (
    "client-side TTFT, inter-token latency and output tokens/s on loopback, one simulator pod with fixed "
    "step costs: 'mesh' through the edge's SSE /v1/chat/completions (edge, region, pod), TTFT at the first "
    "content chunk; 'direct' on the same pod's EngineService.Generate gRPC stream, TTFT at the first "
    "delta; same requests, ABBA rounds per level"
)
ARRIVAL_SEED = "overhead-arrivals"


class OverheadBench:
    """One run of the scenario; see the module docstring. Logs of the
    processes go to ``run_dir``; ``progress`` gets one line per step."""

    def __init__(self, plan: OverheadBenchPlan, run_dir: Path, progress: Progress) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self._progress = progress
        self.model = EngineSettings().model
        self.workload = ChatWorkload()

    async def run(self) -> OverheadReport:
        """Start the mesh, measure both systems, stop it. Raises StartupError
        when a process cannot start or the mesh cannot serve a first
        request."""
        plan = self.plan
        async with running_mesh(plan, self.run_dir, self._progress) as mesh:
            self._progress(
                f"serving: edge {mesh.edge_url}, region {mesh.region_address}, pod {mesh.engine_address}; "
                f"safety {'on' if plan.safety else 'off'}"
            )
            mesh_client = SseChatClient(
                mesh.edge_url, self.model, API_KEY, plan.request_timeout_s, SimChunkCounter
            )
            try:
                ignore_eos = await self._mesh_honours_ignore_eos(mesh_client)
                direct_client = EngineGrpcClient(mesh.engine_address, plan.request_timeout_s, ignore_eos)
                try:
                    clients: dict[str, StreamingClient] = {DIRECT: direct_client, MESH: mesh_client}
                    runs = await self._measure_levels(clients)
                finally:
                    await direct_client.close()
            finally:
                await mesh_client.close()
        return self._report(runs, ignore_eos)

    async def _mesh_honours_ignore_eos(self, client: StreamingClient) -> bool:
        """Whether a reply through the mesh runs past its natural end when
        asked to: no simulator reply ends on its own after ``MAX_REPLY_TOKENS``."""
        probe = self.workload.requests("probe", 1, MAX_REPLY_TOKENS + 1)[0]
        record = await client.generate(probe)
        if not record.ok:
            raise StartupError("mesh", f"a first request failed: {record.error}", self.run_dir)
        if record.output_tokens == probe.max_tokens:
            return True
        self._progress(
            f"the mesh path does not honour ignore_eos (a reply of {record.output_tokens} tokens, not "
            f"{probe.max_tokens}): both systems run without it, replies as long as the prompt makes them"
        )
        return False

    async def _measure_levels(self, clients: Mapping[str, StreamingClient]) -> dict[str, list[LevelRun]]:
        plan = self.plan
        busiest = max(plan.levels)
        if plan.warmup:
            warmup = self.workload.requests("warmup", plan.warmup, plan.max_tokens)
            for system in SYSTEMS:
                self._progress(f"{system}: warm-up, {len(warmup)} requests, {busiest} at a time")
                await run_closed_loop(clients[system], warmup, busiest)
        # One delay stream per system from one seed: both draw the same delays.
        jittered = {system: ArrivalJitter(clients[system], plan.jitter_s, ARRIVAL_SEED) for system in SYSTEMS}
        runs: dict[str, list[LevelRun]] = {}
        for level in plan.levels:
            sizes = plan.round_sizes(level)
            for round_index, size in enumerate(sizes):
                requests = self.workload.requests(f"c{level}-r{round_index}", size, plan.max_tokens)
                order = SYSTEMS if round_index % 2 == 0 else tuple(reversed(SYSTEMS))
                for system in order:
                    name = f"{key(system, level)} round {round_index + 1}/{len(sizes)}"
                    run = await measure_level(name, jittered[system], requests, level, self._progress)
                    runs.setdefault(key(system, level), []).append(run)
        return runs

    def _report(self, runs: Mapping[str, list[LevelRun]], ignore_eos: bool) -> OverheadReport:
        plan = self.plan
        results = {
            name: PathMetrics.of(
                [record for run in level_runs for record in run.records],
                sum(run.wall_s for run in level_runs),
            )
            for name, level_runs in runs.items()
        }
        setup: dict[str, object] = {
            "engine": {
                "backend": "sim",
                "max_num_seqs": plan.max_num_seqs,
                "kv_blocks": KV_BLOCKS,
                **plan.timing.as_dict(),
            },
            "region": {"safety_backends": "rules" if plan.safety else "none", "zone_store": "sqlite file"},
            "workload": {
                "max_tokens": plan.max_tokens,
                "ignore_eos": ignore_eos,
                "system_words": self.workload.system_words,
                "user_words": list(self.workload.user_words),
                "requests_per_level": {f"c{level}": plan.requests_at(level) for level in plan.levels},
                "rounds": plan.rounds,
                "warmup_requests": plan.warmup,
                "arrival_jitter_s": plan.jitter_s,
            },
        }
        mismatches = {
            f"c{level}": _length_mismatches(runs[key(DIRECT, level)], runs[key(MESH, level)])
            for level in plan.levels
        }
        return OverheadReport(self.model, plan.levels, results, setup, MEASURED, mismatches)


def _length_mismatches(direct: Sequence[LevelRun], mesh: Sequence[LevelRun]) -> int:
    """Requests that both systems completed with different reply lengths."""
    return sum(
        1
        for direct_run, mesh_run in zip(direct, mesh, strict=True)
        for a, b in zip(direct_run.records, mesh_run.records, strict=True)
        if a.ok and b.ok and a.output_tokens != b.output_tokens
    )


def overhead_scenario(
    plan: OverheadBenchPlan, progress: Progress
) -> Callable[[Path], tuple[OverheadReport, str | None]]:
    """The scenario as the command line runs it: the report, and what went
    wrong (failed requests) or None."""

    def scenario(run_dir: Path) -> tuple[OverheadReport, str | None]:
        report = asyncio.run(OverheadBench(plan, run_dir, progress).run())
        errors = report.errors()
        return report, f"{errors} requests failed" if errors else None

    return scenario
