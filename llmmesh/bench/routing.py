"""``llmmesh bench routing``: the region's routing policies over several
engine pods, and ``vllm-router`` (``cache_aware``, ``kv_aware`` fed by
vLLM's KV-cache events) over ``vllm serve`` pods as the peer.

On the simulator the default is virtual time (``--clock virtual``,
:mod:`llmmesh.bench.routing_virtual`: the region's placement code over
simulator pods in one process, the same figures on any machine); what
follows describes the real-time run (``--clock real``, and vLLM always).

What is measured: time to first token and output throughput as the client
sees them, through the region's ``ChatService`` over gRPC for ours (the
region's whole turn path: authentication, admission, tokenization for the
router, placement, the engine stream) and through the router's
OpenAI-compatible HTTP API for the peer, both on loopback; the prefix-cache
hit rate is the change in the pods' own ``vllm:prefix_cache_hits`` over
``vllm:prefix_cache_queries`` across the measured phase, read the same way
for every system. The region runs with its safety filters off (the peer
has none) and a zone store in memory.

The workload (:mod:`llmmesh.bench.routing_workload`): tenants with long
system prompts, multi-turn conversations, ``concurrency`` users each running
one conversation at a time. On the simulator the pods' KV cache is sized
from the workload so that its working set fills a given share (default 70%)
of the cluster's cache while no single pod can hold every tenant's prefix;
the simulator's timing stays at its calibrated defaults. On vLLM-CPU the
cache comes in whole GiB, so the pressure is what it is, and reported.

On the simulator, each policy of ``disaggregated`` runs once more on the
same number of pods split into prefill and decode pods (``llmmesh/precise+pd``;
:mod:`region.placement.disaggregation`), so TTFT p90, ITL p90 and throughput with and
without disaggregation compare at the same pod count. The workload above
rewards prefix reuse; ``--workload prefill-heavy``
(:mod:`llmmesh.bench.routing_prefill_heavy`) is the one where prefill
steps stall running decodes on whole-turn pods.

Every system runs on fresh pods behind a fresh router or region, one system
at a time: a warm-up of ``warmup_per_tenant`` conversations per tenant (not
measured), then the measured conversations.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc.aio

from llmmesh.bench.loadgen import quarter_reporter
from llmmesh.bench.plan import RoutingBackendPlan, RoutingBenchPlan
from llmmesh.bench.processes import StartupError, free_port
from llmmesh.bench.routing_clients import (
    PrefixCacheProbe,
    RegionChatClient,
    RouterChatClient,
    TurnClient,
    run_conversations,
    turn_trace,
)
from llmmesh.bench.routing_prefill_heavy import PREFILL_HEAVY, PrefillHeavyWorkload, batch_kv_blocks
from llmmesh.bench.routing_report import (
    DISAGGREGATED,
    BackendReport,
    ItlTail,
    RoutingReport,
    SystemResult,
    system_name,
)
from llmmesh.bench.routing_seed_workloads import AGENTIC, RAG, AgenticWorkload, RagWorkload
from llmmesh.bench.routing_systems import (
    API_KEY,
    HOST,
    Launcher,
    Pod,
    SimPodSpec,
    router_command,
    router_executable,
)
from llmmesh.bench.routing_virtual import MEASURED_VIRTUAL, virtual_backend_report
from llmmesh.bench.routing_workload import (
    ConversationWorkload,
    KvSizing,
    Message,
    RoutingWorkload,
    TokenCounter,
    WorkingSet,
    blocks_for_pressure,
    sim_token_counter,
    working_set,
)
from llmmesh.bench.stats import summarize
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.tiny_model import resolve_model_dir
from llmmesh.engine.vllm_engine.config import VllmEngineConfig
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

Progress = Callable[[str], None]

MEASURED = (
    "client-side TTFT and output tokens/s on loopback: ours through the region's ChatService (gRPC), "
    "the peer through vllm-router's OpenAI HTTP API; prefix-cache hit rate from the pods' own "
    "vllm:prefix_cache_hits / vllm:prefix_cache_queries deltas over the measured phase"
)
# vLLM's KV block size on CPU when none is given (its platform default).
VLLM_CPU_BLOCK_SIZE = 128


def workload_of(plan: RoutingBackendPlan) -> RoutingWorkload:
    return RoutingWorkload(
        tenants=plan.tenants,
        system_words=plan.system_words,
        conversations_per_tenant=plan.conversations_per_tenant,
        turns_per_conversation=plan.turns_per_conversation,
        max_tokens=plan.max_tokens,
        reply_words=plan.max_tokens,
    )


def sim_workload(plan: RoutingBackendPlan) -> tuple[ConversationWorkload, WorkingSet, int]:
    """The simulator's workload, its working set and the KV blocks per pod:
    ``kv_blocks`` when set, else sized to ``kv_pressure`` (prefix reuse) or
    to a full batch of the longest turn (prefill-heavy)."""
    counter = sim_token_counter()
    if plan.workload in (RAG, AGENTIC):
        seeded = RagWorkload.of(plan) if plan.workload == RAG else AgenticWorkload.of(plan)
        working = seeded.working_set(plan.concurrency, counter)
        return seeded, working, plan.kv_blocks or _pressure_blocks(working, plan)
    if plan.workload == PREFILL_HEAVY:
        heavy = PrefillHeavyWorkload.of(plan)
        working = heavy.working_set(plan.concurrency, counter)
        blocks = batch_kv_blocks(working.longest_turn_tokens, plan.max_num_seqs, plan.block_size)
        return heavy, working, plan.kv_blocks or blocks
    workload = workload_of(plan)
    working = working_set(workload, plan.concurrency, counter)
    return workload, working, plan.kv_blocks or _pressure_blocks(working, plan)


def _pressure_blocks(working: WorkingSet, plan: RoutingBackendPlan) -> int:
    """KV blocks per pod for ``plan.kv_pressure``, and at least one turn at
    its longest (many pods for few users would otherwise hold none)."""
    pressure = blocks_for_pressure(working.tokens, plan.pods, plan.block_size, plan.kv_pressure)
    return max(pressure, math.ceil(working.longest_turn_tokens / plan.block_size) + 1)


def sim_setup(plan: RoutingBackendPlan) -> tuple[ConversationWorkload, KvSizing, SimPodSpec]:
    """The simulator's workload, its KV sizing and the pods' settings, in
    real or virtual time alike. Raises ValueError when the longest turn
    does not fit the context window."""
    workload, working, kv_blocks = sim_workload(plan)
    context_window = EngineSettings().context_window
    if working.longest_turn_tokens > context_window:
        raise ValueError(
            f"the longest turn needs {working.longest_turn_tokens} tokens, more than the "
            f"{context_window}-token context window; shorten the workload"
        )
    if kv_blocks * plan.block_size < working.longest_turn_tokens:
        raise ValueError(
            f"--kv-blocks {kv_blocks} gives a pod {kv_blocks * plan.block_size} tokens of KV cache; the "
            f"longest turn needs {working.longest_turn_tokens}: raise --kv-blocks"
        )
    sizing = KvSizing(plan.pods, plan.block_size, kv_blocks, working)
    return workload, sizing, SimPodSpec(kv_blocks, plan.block_size, plan.max_num_seqs, context_window)


def hf_token_counter(model_dir: Path) -> TokenCounter:
    """Counts prompt tokens with the model's own tokenizer and chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def count(messages: Sequence[Message], add_generation_prompt: bool) -> int:
        chat = [{"role": role, "content": text} for role, text in messages]
        ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=add_generation_prompt)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return count


async def engine_info(address: str) -> engine_service_pb2.GetEngineInfoResponse:
    """One pod's description (block size, KV blocks)."""
    async with grpc.aio.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        stub = engine_service_pb2_grpc.EngineServiceStub(channel)
        response: engine_service_pb2.GetEngineInfoResponse = await stub.GetEngineInfo(
            engine_service_pb2.GetEngineInfoRequest(), timeout=10.0
        )
        return response


class RoutingBench:
    """One run of the scenario; see the module docstring. Logs of the
    processes go to ``run_dir``; ``progress`` gets one line per step."""

    def __init__(self, plan: RoutingBenchPlan, run_dir: Path, progress: Progress) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self._progress = progress
        self._launcher = Launcher(run_dir, progress, plan.startup_timeout_s)
        self.model = EngineSettings().model

    async def run(self) -> RoutingReport:
        """Measure every backend of the plan in real time (a virtual
        simulator run is :meth:`run_virtual`'s). Raises StartupError when
        one of our processes cannot start (after stopping it)."""
        sim = vllm = None
        async with self._launcher.global_plane() as global_address:
            if self.plan.sim is not None:
                sim = await self._run_sim(self.plan.sim, global_address)
            if self.plan.vllm is not None:
                vllm = await self._run_vllm(self.plan.vllm, global_address)
        return RoutingReport(model=self.model, measured=MEASURED, sim=sim, vllm=vllm, clock="real")

    async def run_virtual(self) -> RoutingReport:
        """The simulator's part of the plan in virtual time
        (:mod:`llmmesh.bench.routing_virtual`); must run on a
        :class:`~llmmesh.bench.virtual_clock.VirtualClockLoop`."""
        assert self.plan.sim is not None
        sim = await virtual_backend_report(self.plan.sim, self.plan.regions, self.model, self._progress)
        return RoutingReport(model=self.model, measured=MEASURED_VIRTUAL, sim=sim, vllm=None, clock="virtual")

    async def _run_sim(self, plan: RoutingBackendPlan, global_address: str) -> BackendReport:
        workload, sizing, spec = sim_setup(plan)
        kv_blocks = spec.kv_blocks
        self._progress(
            f"sim: {plan.pods} pods of {kv_blocks} KV blocks, KV pressure {sizing.kv_pressure:.2f}, "
            f"shared prefixes {sizing.shared_prefix_over_pod_kv:.2f}x one pod's cache"
        )
        systems: dict[str, SystemResult] = {}
        for policy in plan.policies:
            name = system_name(policy)
            async with (
                self._launcher.sim_pods(plan.pods, spec) as pods,
                self._launcher.region(policy, global_address, pods) as address,
            ):
                client = RegionChatClient(address, API_KEY, self.model, self.plan.request_timeout_s)
                systems[name] = await self._measure(f"sim {name}", client, pods, workload, plan)
        # The same pod count, half of it prefilling (the rounding favours decode).
        prefill = plan.pods // 2
        roles = ["prefill"] * prefill + ["decode"] * (plan.pods - prefill)
        for policy in plan.disaggregated:
            name = system_name(policy + DISAGGREGATED)
            async with (
                self._launcher.sim_pods(plan.pods, spec, roles) as pods,
                self._launcher.region(policy, global_address, pods) as address,
            ):
                client = RegionChatClient(address, API_KEY, self.model, self.plan.request_timeout_s)
                systems[name] = await self._measure(f"sim {name}", client, pods, workload, plan)
        return BackendReport(
            "sim", plan.concurrency, spec.as_dict(), workload.describe(), sizing.as_dict(), systems
        )

    async def _run_vllm(self, plan: RoutingBackendPlan, global_address: str) -> BackendReport:
        model_dir = resolve_model_dir(self.plan.model_path)
        settings = EngineSettings(backend="vllm", model_path=str(model_dir), max_num_seqs=plan.max_num_seqs)
        config = VllmEngineConfig.from_settings(settings, model_dir)
        workload = workload_of(plan)
        working = working_set(workload, plan.concurrency, hf_token_counter(model_dir))
        block_size, kv_blocks = VLLM_CPU_BLOCK_SIZE, 0
        systems: dict[str, SystemResult] = {}
        for policy in plan.policies:
            name = system_name(policy)
            async with (
                self._launcher.vllm_pods(plan.pods, config) as pods,
                self._launcher.region(policy, global_address, pods) as address,
            ):
                info = await engine_info(pods[0].address)
                block_size, kv_blocks = info.block_size, int(info.kv_blocks_total)
                client = RegionChatClient(address, API_KEY, self.model, self.plan.request_timeout_s)
                systems[name] = await self._measure(f"vllm {name}", client, pods, workload, plan)
        peer_error, failures = await self._run_peer(plan, config, workload, block_size, systems)
        engine = {
            "backend": "vllm",
            "kv_cache_gib": config.kv_cache_gib,
            "dtype": config.dtype,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_model_len": config.max_model_len,
            "block_size": block_size,
        }
        # Unknown before our pods ran: then the cache's size is not reported.
        sizing = KvSizing(plan.pods, block_size, max(kv_blocks, 1), working).as_dict()
        if not kv_blocks:
            sizing = dict.fromkeys(sizing) | {"pods": plan.pods, "block_size": block_size}
        return BackendReport(
            "vllm",
            plan.concurrency,
            engine,
            workload.describe(),
            sizing,
            systems,
            failures,
            peer_error,
        )

    async def _run_peer(
        self,
        plan: RoutingBackendPlan,
        config: VllmEngineConfig,
        workload: RoutingWorkload,
        block_size: int,
        systems: dict[str, SystemResult],
    ) -> tuple[str | None, dict[str, str]]:
        """vllm-router by each peer policy into ``systems``; returns why the
        peer could not run at all, and which policies failed to start."""
        if not plan.peer_policies:
            return None, {}
        executable = router_executable()
        if executable is None:
            return "vllm-router is not installed (pip install vllm-router)", {}
        failures: dict[str, str] = {}
        for policy in plan.peer_policies:
            name = system_name(policy, peer=True)
            try:
                async with self._launcher.serve_pods(plan.pods, config) as pods:
                    port = free_port(HOST)
                    argv = router_command(executable, policy, pods, port, self.model, block_size)
                    async with self._launcher.router(argv, f"http://{HOST}:{port}") as base_url:
                        client = RouterChatClient(
                            base_url, self.model, plan.concurrency, self.plan.request_timeout_s
                        )
                        systems[name] = await self._measure(f"vllm {name}", client, pods, workload, plan)
            except StartupError as err:
                self._progress(f"vllm {name}: {err}")
                failures[name] = str(err)
        peer_error = None
        if failures and len(failures) == len(plan.peer_policies):
            peer_error = "; ".join(failures.values())
        return peer_error, failures

    async def _measure(
        self,
        name: str,
        client: TurnClient,
        pods: Sequence[Pod],
        workload: ConversationWorkload,
        plan: RoutingBackendPlan,
    ) -> SystemResult:
        """Warm up, then run the measured conversations; the pods' prefix
        counters are read around the measured phase only."""
        probe = PrefixCacheProbe([pod.metrics_url for pod in pods])
        try:
            if plan.warmup_per_tenant:
                warmup = workload.conversations("warmup", plan.warmup_per_tenant)
                self._progress(f"{name}: warm-up, {len(warmup)} conversations")
                await run_conversations(client, warmup, plan.concurrency)
            conversations = workload.conversations("measure")
            self._progress(
                f"{name}: {workload.turns_total} turns in {len(conversations)} conversations, "
                f"{plan.concurrency} users"
            )
            before = await probe.read()
            measure_started = time.perf_counter()
            run = await run_conversations(
                client,
                conversations,
                plan.concurrency,
                quarter_reporter(lambda done, total: self._progress(f"{name}: {done}/{total} turns done")),
                plan.ramp_s,
            )
            prefix = await probe.read() - before
        finally:
            with contextlib.suppress(Exception):
                await client.close()
        metrics = summarize(run.records, run.wall_s)
        itl = ItlTail.of(run.records)
        trace = self.run_dir / f"{name.replace(' ', '-').replace('/', '-')}-turns.jsonl"
        lines = turn_trace(conversations, run.records, measure_started)
        trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
        errors = [record.error for record in run.records if record.error]
        if errors:
            self._progress(f"{name}: {len(errors)} failed, first: {errors[0]}")
        hit_rate = prefix.hit_rate
        self._progress(
            f"{name}: ttft p50 {_ms(metrics.ttft_p50_s)} p90 {_ms(metrics.ttft_p90_s)}, "
            f"itl p90 {_ms(itl.p90_s)} p99 {_ms(itl.p99_s)}, "
            f"{metrics.output_tok_s:.1f} output tok/s, prefix hit rate "
            f"{'-' if hit_rate is None else f'{hit_rate:.3f}'} in {run.wall_s:.1f} s"
        )
        return SystemResult(metrics, prefix, itl)


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f} ms"
