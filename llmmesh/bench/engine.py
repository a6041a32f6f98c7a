"""``llmmesh bench engine``: our engine pod (gRPC, vLLM backend) against
``vllm serve`` on the same model with the same engine arguments.

Both are described by one :class:`~engine.vllm_engine.config.VllmEngineConfig`,
so they share the model, ``max_model_len``, ``max_num_seqs``, the
batched-token budget, the KV-cache size, dtype, prefix caching, scheduling
policy and eager mode; both publish KV-cache events (our router needs them,
and vLLM's own deployments behind a KV-aware router run with them); both
processes get the same environment (``VLLM_CPU_KVCACHE_SPACE``,
``PYTHONHASHSEED``).

The systems run one at a time, never at once (two idle vLLM engines on two
cores still stall each other's streams now and then): ours, then the peer,
then ours again (A B A), each started, warmed up at the busiest level's
concurrency and stopped with its whole process group. Each level runs in
``rounds`` rounds of fresh user messages: the peer serves all of them, ours
the first half in its first session and the rest in its second, so both
systems see the same requests and drift over the run weighs on both alike.
A system's figures for a level pool its rounds.

With ``--speculative ngram`` the pair is our pod with speculative decoding
(``llmmesh-spec``, in A's place) against our pod without it (``llmmesh``,
in B's), on the same engine otherwise; the ratios are speculation's gain
and the report's ``extra.spec_decode`` holds vLLM's own counters of draft
and accepted tokens (summed over the speculating sessions, warm-up
included), so a ratio comes with the acceptance that explains it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from llmmesh.bench.grpc_client import EngineGrpcClient
from llmmesh.bench.loadgen import LevelRun, StreamingClient, measure_level, run_closed_loop
from llmmesh.bench.openai_client import OpenAIChatClient
from llmmesh.bench.plan import EngineBenchPlan
from llmmesh.bench.processes import ChildProcess, StartupError, free_port
from llmmesh.bench.report import BenchReport
from llmmesh.bench.spec_decode import SPEC_COUNTERS, read_counters, speculative_flags
from llmmesh.bench.stats import LevelMetrics, summarize
from llmmesh.bench.workload import ChatRequest, ChatWorkload
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.tiny_model import resolve_model_dir
from llmmesh.engine.vllm_engine.config import VllmEngineConfig

OURS = "llmmesh"
PEER = "vllm-serve"
SPECULATING = "llmmesh-spec"
HOST = "127.0.0.1"

Progress = Callable[[str], None]


def peer_command(config: VllmEngineConfig, port: int, kv_events_dir: Path) -> list[str]:
    """The command line of the peer: ``vllm serve`` with the same engine.

    ``vllm serve`` reads its own version from the ``vllm`` distribution;
    under another distribution name (``vllm-cpu``) it fails before parsing
    its arguments. Then we run ``vllm.entrypoints.openai.api_server``, whose
    ``main`` does what ``vllm serve`` does for one API server (the same
    argument parser and ``run_server``), but which takes the model as
    ``--model``."""
    model, *engine_args = config.serve_arguments()
    # Not an engine argument: one log line per request is work our pod skips.
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{kv_events_dir}/events",
        "topic": "kv",
    }
    server_args = [
        *engine_args,
        "--kv-events-config",
        json.dumps(kv_events),
        "--host",
        HOST,
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
    ]
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *server_args]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *server_args]


def pod_command(config: VllmEngineConfig, settings: EngineSettings, ready_file: Path) -> list[str]:
    """The command line of our pod, every engine argument pinned by flag so
    that no ``LLMMESH_*`` variable can make it differ from the peer. It
    serves plaintext gRPC (``--insecure``), as the peer serves plain HTTP."""
    return [
        sys.executable,
        "-m",
        "llmmesh",
        "engine",
        "--backend",
        "vllm",
        "--model-path",
        str(config.model_path),
        "--model",
        config.served_model_name,
        "--host",
        HOST,
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--ready-file",
        str(ready_file),
        "--context-window",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--max-num-batched-tokens",
        str(config.max_num_batched_tokens),
        "--vllm-kv-cache-gib",
        str(config.kv_cache_gib),
        "--vllm-dtype",
        config.dtype,
        "--pod-id",
        settings.pod_id,
        "--insecure",
        *speculative_flags(config),
    ]


class EngineBench:
    """One run of the scenario; see the module docstring. Logs of the
    systems go to ``run_dir``; ``progress`` gets one line per step."""

    def __init__(self, plan: EngineBenchPlan, run_dir: Path, progress: Progress) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self._progress = progress
        model_dir = resolve_model_dir(plan.model_path)
        self.settings = EngineSettings(backend="vllm", model_path=str(model_dir))
        self.config = VllmEngineConfig.from_settings(self.settings, model_dir)
        self.workload = ChatWorkload()
        self._env = {**os.environ, **self.config.environment()}
        self._sessions_started = 0
        self.ours, self.peer = OURS, PEER
        self.spec_config: VllmEngineConfig | None = None
        self._spec_counters = dict.fromkeys(SPEC_COUNTERS, 0.0)
        if plan.speculative:
            spec_settings = EngineSettings(
                backend="vllm", model_path=str(model_dir), speculative_method=plan.speculative
            )
            self.spec_config = VllmEngineConfig.from_settings(spec_settings, model_dir)
            self.ours, self.peer = SPECULATING, OURS

    def sessions(self) -> list[tuple[str, range]]:
        """Which system runs which rounds, in order: ours, the peer, ours
        again (A B A), so drift over the run weighs on both alike."""
        rounds = self.plan.rounds
        half = (rounds + 1) // 2
        return [(self.ours, range(half)), (self.peer, range(rounds)), (self.ours, range(half, rounds))]

    async def run(self) -> BenchReport:
        """Measure both systems. Raises StartupError when one cannot start
        (after stopping it)."""
        runs: dict[str, list[LevelRun]] = {}
        for system, rounds in self.sessions():
            if not rounds:
                continue
            async with self._start(system) as client:
                if self.plan.warmup_requests:
                    # As many at once as the busiest level, so the engine has
                    # run every batch size before anything is measured.
                    self._progress(f"{system}: warm-up, {self.plan.warmup_requests} requests")
                    warmup = self.workload.requests("warmup", self.plan.warmup_requests, self.plan.max_tokens)
                    await run_closed_loop(client, warmup, max(self.plan.concurrency))
                for concurrency in self.plan.concurrency:
                    level = f"c{concurrency}"
                    for round_index in rounds:
                        requests = self.workload.requests(
                            f"{level}-r{round_index}",
                            self.plan.requests_at(concurrency),
                            self.plan.max_tokens,
                        )
                        name = f"{system}/{level} round {round_index + 1}/{self.plan.rounds}"
                        run = await self._measure(name, client, requests, concurrency)
                        runs.setdefault(f"{system}/{level}", []).append(run)
        results: dict[str, LevelMetrics] = {
            key: summarize(
                [record for run in level_runs for record in run.records],
                sum(run.wall_s for run in level_runs),
            )
            for key, level_runs in runs.items()
        }
        return BenchReport(
            scenario="engine",
            model=self.config.served_model_name,
            ours=self.ours,
            peer=self.peer,
            levels=[f"c{c}" for c in self.plan.concurrency],
            results=results,
            extra=self._extra(),
        )

    def _extra(self) -> dict[str, object]:
        if self.spec_config is None:
            return {}
        drafted = self._spec_counters["draft_tokens"]
        accepted = self._spec_counters["accepted_tokens"]
        return {
            "spec_decode": {
                **self.spec_config.speculative,  # type: ignore[dict-item]
                "draft_tokens": int(drafted),
                "accepted_tokens": int(accepted),
                "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            }
        }

    def _start(self, system: str) -> contextlib.AbstractAsyncContextManager[StreamingClient]:
        if system == PEER:
            return self._start_peer()
        if system == SPECULATING:
            assert self.spec_config is not None
            return self._start_pod(SPECULATING, self.spec_config)
        return self._start_pod(OURS, self.config)

    async def _measure(
        self,
        name: str,
        client: StreamingClient,
        requests: Sequence[ChatRequest],
        concurrency: int,
    ) -> LevelRun:
        return await measure_level(name, client, requests, concurrency, self._progress)

    @contextlib.asynccontextmanager
    async def _start_pod(self, name: str, config: VllmEngineConfig) -> AsyncIterator[StreamingClient]:
        ready_file = self.run_dir / f"{name}.ready.json"
        # A later session must not read an earlier session's address.
        ready_file.unlink(missing_ok=True)
        argv = pod_command(config, self.settings, ready_file)
        async with self._child(name, argv) as child:
            info = await child.wait_ready_file(ready_file, self.plan.startup_timeout_s)
            address = info.get("address")
            if not isinstance(address, str):
                raise StartupError(name, "the ready file names no address", child.log_path)
            self._progress(f"{name}: serving on {address} after {child.uptime_s():.1f} s")
            client = EngineGrpcClient(address, self.plan.request_timeout_s)
            try:
                yield client
            finally:
                await client.close()
                metrics_url = info.get("metrics_url")
                if config.speculating and isinstance(metrics_url, str):
                    # Counters die with the process: read them before it stops.
                    counted = await asyncio.to_thread(read_counters, metrics_url, SPEC_COUNTERS)
                    for key, value in counted.items():
                        self._spec_counters[key] += value

    @contextlib.asynccontextmanager
    async def _start_peer(self) -> AsyncIterator[StreamingClient]:
        port = free_port(HOST)
        base_url = f"http://{HOST}:{port}"
        kv_events_dir = self.run_dir / "peer-kv-events"
        kv_events_dir.mkdir(exist_ok=True)
        async with self._child(PEER, peer_command(self.config, port, kv_events_dir)) as child:
            await child.wait_http_ok(f"{base_url}/health", self.plan.startup_timeout_s)
            self._progress(f"{PEER}: serving on {base_url} after {child.uptime_s():.1f} s")
            client = OpenAIChatClient(
                base_url,
                self.config.served_model_name,
                max_connections=max(max(self.plan.concurrency), self.plan.warmup_requests),
                request_timeout_s=self.plan.request_timeout_s,
            )
            try:
                yield client
            finally:
                await client.close()

    @contextlib.asynccontextmanager
    async def _child(self, name: str, argv: Sequence[str]) -> AsyncIterator[ChildProcess]:
        """Start ``argv`` as ``name`` and stop its whole process group on the
        way out, whatever happens (Ctrl-C included)."""
        self._sessions_started += 1
        log_path = self.run_dir / f"{self._sessions_started}-{name}.log"
        self._progress(f"{name}: starting (log: {log_path})")
        child = ChildProcess.start(name, argv, log_path, self._env)
        try:
            yield child
        finally:
            self._progress(f"{name}: stopping")
            if not child.stop():
                self._progress(f"{name}: some of its processes outlived SIGKILL")
