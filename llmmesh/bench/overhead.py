"""``llmmesh bench overhead``: what the mesh adds over the engine.

The mesh runs as ``llmmesh up`` runs it, every plane its own process
(:mod:`llmmesh.bench.overhead_systems`): a global plane, one simulator
engine pod with fixed step costs (:class:`~llmmesh.bench.overhead_plan.SimTiming`:
no batch slowdown, no jitter, a prefill cost independent of the prompt),
one region and one edge. Two systems share that one pod:

- ``direct``: the benchmark on the pod's ``EngineService.Generate`` gRPC
  stream; time to first token ends at the first ``delta`` event;
- ``mesh``: the benchmark on the edge's streamed ``POST
  /v1/chat/completions`` (edge → region → the same pod); time to first
  token ends at the first chunk with content, not the role chunk.

The planes talk mutual TLS, as they do by default, or plaintext
(``--insecure``), as ``--tls`` says. By default (``both``) the first run
starts three meshes side by side: the plaintext one whose pod ``direct``
shares (``mesh``), its twin on a pod of its own (``mesh_twin``), and the
same mesh on mTLS with certificates the benchmark issues into its run
directory, on a pod of its own too (``mesh_mtls``: edge → region, region
→ pod and both to the global plane on mTLS; the client still reaches the
edge in plain HTTP). It measures the four systems on the same workload in
alternating rounds (direct, mesh, mesh_twin, mesh_mtls, then the other way
round). What mTLS adds is the mTLS mesh's time to first token minus its
twin's: two meshes set up alike but for TLS. What the twin adds over
``mesh`` compares two identical meshes on different pods, so it shows the
resolution of that comparison (a pod that also served ``direct``, or
another process's place on the CPU, moves a median by milliseconds). Later
runs measure the plaintext mesh only. ``--tls off`` measures plaintext
only; ``--tls on`` one mesh on mTLS in every
run, the direct client presenting an operator's certificate to its pod.

``--tracing both`` adds, in the first run, the same plaintext mesh with
OpenTelemetry tracing on in its pod, region and edge, its spans exported
over OTLP to a collector in the benchmark that counts and drops them, on a
pod of its own, and the untraced twin if the run has none yet. Each of its
requests carries a W3C ``traceparent`` as a traced client's does; in each
round half of them are sampled (``mesh_traced``: every plane records and
exports the turn's spans) and the other half not (``mesh_unsampled``: the
planes follow the unsampled flag and record nothing), interleaved and
paired by arrival delay (:class:`~llmmesh.bench.overhead_clients.TraceSampling`).
What tracing adds (``traced_added_*``, with the median's bootstrap 95%
interval) is the sampled turns' time to first token minus the unsampled
ones': the same processes, pod, rounds and load, so it resolves what two
meshes or two rounds cannot (``twin_added_*`` shows how far two identical
meshes differ). Spans are ended and exported in the background of both
halves alike; that work shows in the traced mesh's figures against its
untraced twin (``traced_vs_twin_added_*``), within that comparison's
resolution.

By default the whole measurement runs twice, each time in a fresh mesh:
first with the region's safety filters off (``transport``: what the mesh's
path adds), then with them on (``with_output_filter``: the product path).
``--safety off`` or ``--safety on`` makes only that run. The two differ
where a reply's first token could begin a rule (a one-word deny-listed
term's first letters, digits that may grow into a card number; a phrase's
first word only where the region holds it, ``--safety-hold-first-word``):
the streaming output filter holds such text until the next token tells,
about one decode step;
the direct path has no such filter. The targets are judged on the
transport run, and what the filter adds to time to first token is reported on its own:
what the mesh adds with the filter on minus what it adds with it off, each
run against its own direct reference.

In each run both systems send the same requests (the seeded chat
workload, greedy, the same ``max_tokens``) at each concurrency level in a
closed loop. ``ignore_eos`` makes every reply ``max_tokens`` long; a first
probe checks that the whole mesh path honours it, and where it does not,
all systems run without it: the simulator's reply length is then a
function of the prompt, which all send alike, so replies still match one
for one (the report counts any that do not). ``--reply-lengths natural``
runs without it on purpose: with every reply ``max_tokens`` long, the
streams of a level that start together end together and start their next
requests together, so the pod prefills them in one step; a path that
spreads those starts over several steps (the mesh's time to first token
varies by tens of milliseconds at c64) pays a prefill step (here a fixed
cost, whatever the prompt) for each, and its throughput falls with the
spread rather than with its own cost. Replies of their natural lengths
(12 to 80 tokens, capped at ``max_tokens``, the same request alike in
every system) end at different steps on either path. Each level runs in rounds,
the systems alternating ABBA (ABC CBA with three), after a warm-up of each
at the busiest level; a system's figures pool its rounds.

Each round starts with one request of its own through its system, kept
out of the round's figures. The alternation leaves each system idle for
the other's round, longer than the edge trusts a key without asking the
global plane again (5 s), which a steady load at the level never does: a
round's first burst would otherwise measure a cold start. The cold start
is reported on its own instead: what the mesh adds to the time to first
token of those requests, each sent after its system idled
(``added_ttft_after_idle_ms``, the median over rounds).

Each request is sent after a seeded random delay of up to one decode step,
outside its TTFT. Without it, a closed loop sends each request right after
the step that ended the previous one, so requests reach a busy pod at a
fixed phase of its step cycle set by the path's own latency, and the wait
for the next step boundary would hide part of what the path adds (a
request that arrives later waits less). Independent users arrive at random
phases; the delay restores that, and costs both systems the same. A
round's delays are stratified (one in each equal slice of the range, in a
seeded order, the same for every system), so that the phases, and with
them most of the spread of time to first token at a busy pod, are spread
alike for every system rather than left to independent draws.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from llmmesh.bench.grpc_client import EngineGrpcClient
from llmmesh.bench.loadgen import LevelRun, StreamingClient, measure_level, run_closed_loop
from llmmesh.bench.mesh_tls import pod_client_security, pod_server_name
from llmmesh.bench.overhead_clients import ArrivalJitter, SimChunkCounter, TraceSampling, split_run
from llmmesh.bench.overhead_hops import HopSnapshot, cpu_seconds, scrape_hops, total
from llmmesh.bench.overhead_otlp import SpanSink, running_span_sink
from llmmesh.bench.overhead_plan import OverheadBenchPlan
from llmmesh.bench.overhead_report import (
    DIRECT,
    MESH,
    MESH_MTLS,
    MESH_TRACED,
    MESH_TWIN,
    MESH_UNSAMPLED,
    OverheadReport,
    OverheadRun,
    PathMetrics,
    key,
    run_name,
    systems_of,
)
from llmmesh.bench.overhead_sse import SseChatClient
from llmmesh.bench.overhead_systems import KV_BLOCKS, Mesh, issue_mesh_certs, running_mesh, safety_backends
from llmmesh.bench.processes import StartupError
from llmmesh.bench.routing_systems import API_KEY, REGION, ZONE
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatWorkload
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.sampler import MAX_REPLY_TOKENS

Progress = Callable[[str], None]

MEASURED = (
    "client-side TTFT, inter-token latency and output tokens/s on loopback, one simulator pod with fixed "
    "step costs: 'mesh' through the edge's SSE /v1/chat/completions (edge, region, pod), TTFT at the first "
    "content chunk; 'direct' on the same pod's EngineService.Generate gRPC stream, TTFT at the first "
    "delta; where run, 'mesh_twin' the same through a second plaintext mesh and 'mesh_mtls' through a third "
    "whose planes talk mutual TLS, and 'mesh_traced' and 'mesh_unsampled' the sampled and unsampled "
    "halves of each round through one whose pod, region and edge trace to an OTLP collector, each mesh "
    "with its own pod of the same timing; same requests, alternating rounds per level, each run in fresh "
    "meshes"
)
ARRIVAL_SEED = "overhead-arrivals"
SAMPLING_SEED = "overhead-trace-sampling"


class OverheadBench:
    """The scenario, one run per safety setting of the plan; see the module
    docstring. Each run's mesh keeps its logs in a folder of ``run_dir``
    named after the run; ``progress`` gets one line per step."""

    def __init__(self, plan: OverheadBenchPlan, run_dir: Path, progress: Progress) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self._progress = progress
        self.model = EngineSettings().model
        self.workload = ChatWorkload()
        self.sampling = TraceSampling(SAMPLING_SEED)

    async def run(self) -> OverheadReport:
        """Measure the systems in fresh meshes for each of the plan's
        safety settings, in order. Raises StartupError when a process
        cannot start or a mesh cannot serve a first request."""
        runs = [await self._run_mesh(safety) for safety in self.plan.safety_runs]
        return OverheadReport(self.model, self.plan.levels, runs, self._setup(), MEASURED)

    def _certs(self) -> Path:
        """The certificates of every mTLS mesh of this benchmark: one CA of
        its own in the run directory, issued on first use."""
        return issue_mesh_certs(self.run_dir / "certs")

    async def _run_mesh(self, safety: bool) -> OverheadRun:
        """Start the run's meshes (see :meth:`OverheadBenchPlan.tls_of`)
        with the region's safety filters on or off, measure the systems on
        them, stop them."""
        plan = self.plan
        name = run_name(safety)
        tls = plan.tls_of(safety)
        traced = plan.traced_in(safety)

        def progress(line: str) -> None:
            self._progress(f"{name}: {line}")

        async with contextlib.AsyncExitStack() as stack:
            sink: SpanSink | None = None
            endpoint: str | None = None
            if traced:
                endpoint, sink = await stack.enter_async_context(running_span_sink())
            meshes: list[Mesh] = []
            # The unsampled turns are the traced mesh's own, in its rounds.
            mesh_systems = [
                system for system in systems_of(tls, traced) if system not in (DIRECT, MESH_UNSAMPLED)
            ]
            for system in mesh_systems:
                mtls = tls == "on" or system == MESH_MTLS
                tracing_to = endpoint if system == MESH_TRACED else None
                run_dir = self.run_dir / name / system
                run_dir.mkdir(parents=True, exist_ok=True)
                certs = self._certs() if mtls else None
                mesh = await stack.enter_async_context(
                    running_mesh(plan, safety, run_dir, progress, certs, tracing_to)
                )
                progress(
                    f"serving: edge {mesh.edge_url}, region {mesh.region_address}, pod "
                    f"{mesh.engine_address}; safety {'on' if safety else 'off'}, planes on "
                    f"{'mTLS' if mtls else 'plaintext gRPC'}"
                    + (f", tracing to {tracing_to}" if tracing_to else "")
                )
                meshes.append(mesh)
            clients: dict[str, StreamingClient] = {}
            fixed = plan.reply_lengths == "fixed"
            for system, mesh in zip(mesh_systems, meshes, strict=True):
                clients[system] = SseChatClient(
                    mesh.edge_url,
                    self.model,
                    API_KEY,
                    plan.request_timeout_s,
                    SimChunkCounter,
                    self.sampling.flags if system == MESH_TRACED else None,
                    ignore_eos=fixed,
                )
                stack.push_async_callback(clients[system].close)
            ignore_eos = fixed
            for system in mesh_systems if fixed else ():
                honoured = await self._mesh_honours_ignore_eos(system, clients[system], progress)
                ignore_eos = ignore_eos and honoured
            reference = meshes[0]
            direct = EngineGrpcClient(
                reference.engine_address,
                plan.request_timeout_s,
                ignore_eos,
                pod_client_security(reference.certs, REGION),
                pod_server_name(ZONE, REGION),
            )
            stack.push_async_callback(direct.close)
            clients = {DIRECT: direct, **clients}
            scraper = httpx.AsyncClient(timeout=plan.request_timeout_s)
            stack.push_async_callback(scraper.aclose)
            # Per-hop figures of every mesh but the traced one, whose rounds mix sampled and unsampled turns.
            metrics = {
                system: mesh.metrics_urls
                for system, mesh in zip(mesh_systems, meshes, strict=True)
                if system != MESH_TRACED and mesh.metrics_urls
            }
            pids = {system: mesh.pids for system, mesh in zip(mesh_systems, meshes, strict=True)}
            # Direct's calls are timed by the pod they go to, as the mesh's are.
            if "engine" in reference.metrics_urls:
                metrics[DIRECT] = {"engine": reference.metrics_urls["engine"]}
            if "engine" in reference.pids:
                pids[DIRECT] = {"engine": reference.pids["engine"]}
            runs, after_idle, marks, hops = await self._measure_levels(
                clients, progress, scraper, metrics, pids
            )
            spans = None if sink is None else sink.spans
        return self._run(safety, tls, runs, after_idle, ignore_eos, spans, marks, hops)

    async def _mesh_honours_ignore_eos(
        self, system: str, client: StreamingClient, progress: Progress
    ) -> bool:
        """Whether a reply through the mesh runs past its natural end when
        asked to: no simulator reply ends on its own after ``MAX_REPLY_TOKENS``."""
        probe = self.workload.requests("probe", 1, MAX_REPLY_TOKENS + 1)[0]
        record = await client.generate(probe)
        if not record.ok:
            raise StartupError(system, f"a first request failed: {record.error}", self.run_dir)
        if record.output_tokens == probe.max_tokens:
            return True
        progress(
            f"the {system} path does not honour ignore_eos (a reply of {record.output_tokens} tokens, not "
            f"{probe.max_tokens}): every system runs without it, replies as long as the prompt makes them"
        )
        return False

    async def _measure_levels(
        self,
        clients: Mapping[str, StreamingClient],
        progress: Progress,
        scraper: httpx.AsyncClient | None = None,
        metrics: Mapping[str, Mapping[str, str]] | None = None,
        pids: Mapping[str, Mapping[str, int]] | None = None,
    ) -> tuple[
        dict[str, list[LevelRun]],
        dict[str, list[RequestRecord]],
        dict[str, list[list[bool]]],
        dict[str, HopSnapshot],
    ]:
        """Each system's rounds by ``{system}/c{level}``, the request that
        began each of its rounds after it idled, for the traced mesh which
        requests of each round it traced (:class:`TraceSampling`), and for
        each system in ``metrics`` (its planes' ``/metrics`` URLs) the hop
        histograms of its rounds (:mod:`llmmesh.bench.overhead_hops`),
        scraped with ``scraper`` just before and after each round, with the
        CPU time its processes (``pids``, by name) and this one used in them."""
        plan = self.plan
        busiest = max(plan.levels)
        systems = tuple(clients)
        if plan.warmup:
            warmup = self.workload.requests("warmup", plan.warmup, plan.max_tokens)
            for system in systems:
                progress(f"{system}: warm-up, {len(warmup)} requests, {busiest} at a time")
                await run_closed_loop(clients[system], warmup, busiest)
        # One delay stream per system from one seed: all draw the same delays.
        jittered = {system: ArrivalJitter(clients[system], plan.jitter_s, ARRIVAL_SEED) for system in systems}
        runs: dict[str, list[LevelRun]] = {}
        after_idle: dict[str, list[RequestRecord]] = {}
        marks: dict[str, list[list[bool]]] = {}
        rounds_hops: dict[str, list[HopSnapshot]] = {}
        metrics = metrics or {}
        pids = pids or {}
        for level in plan.levels:
            sizes = plan.round_sizes(level)
            for round_index, size in enumerate(sizes):
                requests = self.workload.requests(f"c{level}-r{round_index}", size, plan.max_tokens)
                first = self.workload.requests(f"c{level}-r{round_index}-start", 1, plan.max_tokens)[0]
                order = systems if round_index % 2 == 0 else tuple(reversed(systems))
                for system in order:
                    name = f"{key(system, level)} round {round_index + 1}/{len(sizes)}"
                    start = await clients[system].generate(first)
                    if not start.ok:
                        progress(f"{name}: its first request failed: {start.error}")
                    after_idle.setdefault(key(system, level), []).append(start)
                    delays = jittered[system].deal(f"c{level}-r{round_index}", len(requests))
                    if system == MESH_TRACED:
                        sampled = self.sampling.deal(f"c{level}-r{round_index}", requests, delays)
                        marks.setdefault(key(system, level), []).append(sampled)
                    urls = metrics.get(system) if scraper is not None else None
                    processes = pids.get(system, {})
                    before = await scrape_hops(scraper, urls) if scraper is not None and urls else None
                    cpu_before = cpu_seconds(processes) if before is not None else {}
                    run = await measure_level(name, jittered[system], requests, level, progress)
                    runs.setdefault(key(system, level), []).append(run)
                    if before is not None and scraper is not None and urls:
                        delivered = sum(record.output_tokens for record in run.records)
                        used = HopSnapshot(cpu_s=cpu_seconds(processes), output_tokens=delivered)
                        after = await scrape_hops(scraper, urls)
                        rounds_hops.setdefault(key(system, level), []).append(
                            after - before + (used - HopSnapshot(cpu_s=cpu_before))
                        )
        hops = {name: total(snapshots) for name, snapshots in rounds_hops.items()}
        return runs, after_idle, marks, hops

    def _run(
        self,
        safety: bool,
        tls: str,
        runs: Mapping[str, list[LevelRun]],
        after_idle: Mapping[str, list[RequestRecord]],
        ignore_eos: bool,
        spans_exported: int | None = None,
        marks: Mapping[str, list[list[bool]]] | None = None,
        hops: Mapping[str, HopSnapshot] | None = None,
    ) -> OverheadRun:
        """The run's figures; ``spans_exported``, what the traced mesh sent
        its collector (None without one); ``marks``, which requests of each
        of its rounds it traced: its sampled requests are ``mesh_traced``'s
        figures, the others ``mesh_unsampled``'s; ``hops``, each mesh's hop
        histograms by ``{system}/c{level}``."""
        parts = dict(runs)
        for level in self.plan.levels:
            traced = key(MESH_TRACED, level)
            if marks and traced in marks:
                halves = [split_run(run, mask) for run, mask in zip(runs[traced], marks[traced], strict=True)]
                parts[traced] = [sampled for sampled, _ in halves]
                parts[key(MESH_UNSAMPLED, level)] = [unsampled for _, unsampled in halves]
        results = {
            name: PathMetrics.of(
                [record for run in level_runs for record in run.records],
                sum(run.wall_s for run in level_runs),
            )
            for name, level_runs in parts.items()
        }
        meshes = [
            system
            for system in (MESH, MESH_TWIN, MESH_MTLS, MESH_TRACED)
            if key(system, self.plan.levels[0]) in runs
        ]
        mismatches = {
            f"c{level}": sum(
                _length_mismatches(runs[key(DIRECT, level)], runs[key(system, level)]) for system in meshes
            )
            for level in self.plan.levels
        }
        setup: dict[str, object] = {"safety_backends": safety_backends(safety), "ignore_eos": ignore_eos}
        if spans_exported is not None:
            # Spans still in the planes' batches when the run ended are not counted.
            setup["traced_spans_exported"] = spans_exported
        return OverheadRun(
            safety, results, mismatches, setup, after_idle, tls, spans_exported is not None, hops or {}
        )

    def _setup(self) -> dict[str, object]:
        """What every run shares; each run's own setting is in its
        :attr:`OverheadRun.setup`."""
        plan = self.plan
        return {
            "engine": {
                "backend": "sim",
                "max_num_seqs": plan.max_num_seqs,
                "kv_blocks": KV_BLOCKS,
                **plan.timing.as_dict(),
            },
            "region": {"zone_store": "sqlite file, one per run"},
            "workload": {
                "max_tokens": plan.max_tokens,
                "system_words": self.workload.system_words,
                "user_words": list(self.workload.user_words),
                "requests_per_level": {f"c{level}": plan.requests_at(level) for level in plan.levels},
                "rounds": plan.rounds,
                "warmup_requests": plan.warmup,
                "arrival_jitter_s": plan.jitter_s,
                "reply_lengths": plan.reply_lengths,
            },
        }


def _length_mismatches(direct: Sequence[LevelRun], mesh: Sequence[LevelRun]) -> int:
    """Requests that direct and a mesh completed with different reply lengths."""
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
    wrong (failed requests in any run) or None."""

    def scenario(run_dir: Path) -> tuple[OverheadReport, str | None]:
        report = asyncio.run(OverheadBench(plan, run_dir, progress).run())
        errors = report.errors()
        return report, f"{errors} requests failed" if errors else None

    return scenario
