"""The processes ``llmmesh bench overhead`` measures, as ``llmmesh up`` runs
them: a global plane, one simulator engine pod with fixed step costs, one
region over it and one edge, each its own process with its log in the run
directory, stopped with its process group.

The region runs as in the product, its safety filters on or off as the
run asks, its routing policy the default, its zone store an SQLite file as
in the embedded mesh. The planes talk mutual TLS with the certificates of
a directory the benchmark issued (:mod:`llmmesh.bench.mesh_tls`), or
plaintext, asked for with ``--insecure``; the benchmark's own client talks
to the edge in plain HTTP either way. A traced mesh's pod, region and edge
trace every turn (:mod:`llmmesh.core.tracing`, sampling every trace) and export
the spans to the benchmark's collector (:mod:`llmmesh.bench.overhead_otlp`);
its global plane, which a turn reaches only when the edge's caches miss,
does not. An untraced mesh traces nothing, whatever the environment says.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmmesh.bench.mesh_tls import issue_certs, plane_tls_flags
from llmmesh.bench.overhead_otlp import ENDPOINT_ENV
from llmmesh.bench.overhead_plan import OverheadBenchPlan
from llmmesh.bench.processes import ChildProcess, StartupError
from llmmesh.bench.routing_systems import HOST, REGION, ZONE, Launcher, child_environment

Progress = Callable[[str], None]

POD_ID = f"{REGION}-pod-0"
# Room for every prompt of the busiest level and its reply many times over:
# no level ever evicts or preempts.
KV_BLOCKS = 8192


@dataclass(frozen=True)
class Mesh:
    """Where the running mesh serves: the engine pod's gRPC address (the
    direct path) and the edge's base URL (the full path); ``certs``, the
    directory of its planes' certificates, None when they talk plaintext;
    ``metrics_urls``, each plane's ``/metrics`` (edge, region, engine);
    ``pids``, each plane's process (global, engine, region, edge)."""

    engine_address: str
    region_address: str
    edge_url: str
    certs: Path | None = None
    metrics_urls: Mapping[str, str] = field(default_factory=dict)
    pids: Mapping[str, int] = field(default_factory=dict)


def sim_engine_command(plan: OverheadBenchPlan, ready_file: Path, certs: Path | None = None) -> list[str]:
    return [
        sys.executable, "-m", "llmmesh", "engine",
        "--backend", "sim",
        "--host", HOST, "--port", "0", "--metrics-port", "0",
        "--ready-file", str(ready_file),
        "--pod-id", POD_ID,
        "--max-num-seqs", str(plan.max_num_seqs),
        "--kv-blocks", str(KV_BLOCKS),
        *plan.timing.engine_flags(),
        *plane_tls_flags(certs, f"engine-{POD_ID}"),
    ]  # fmt: skip


def region_command(
    safety: bool,
    global_address: str,
    engine_address: str,
    run_dir: Path,
    ready_file: Path,
    certs: Path | None = None,
) -> list[str]:
    return [
        sys.executable, "-m", "llmmesh", "region",
        "--host", HOST, "--port", "0",
        "--region", REGION, "--zone", ZONE,
        "--global-address", global_address,
        "--engine-addresses", engine_address,
        "--safety-backends", safety_backends(safety),
        "--zone-store-url", f"sqlite:///{run_dir / f'zone-{ZONE}.db'}",
        "--ready-file", str(ready_file),
        *plane_tls_flags(certs, f"region-{REGION}"),
    ]  # fmt: skip


def edge_command(global_address: str, ready_file: Path, certs: Path | None = None) -> list[str]:
    return [
        sys.executable, "-m", "llmmesh", "edge",
        "--host", HOST, "--port", "0",
        "--global-address", global_address,
        "--ready-file", str(ready_file),
        *plane_tls_flags(certs, "edge"),
    ]  # fmt: skip


def issue_mesh_certs(directory: Path) -> Path:
    """Certificates for every plane of the benchmark's mesh in
    ``directory`` (created with its CA if need be); returns it."""
    return issue_certs(directory, ZONE, REGION, [POD_ID])


def safety_backends(safety: bool) -> str:
    """The region's ``--safety-backends`` with its safety filters on or off."""
    return "rules" if safety else "none"


def plane_environment(otlp_endpoint: str | None) -> dict[str, str]:
    """A plane's environment: tracing every turn to ``otlp_endpoint``, or
    with no collector at all when None."""
    env = {k: v for k, v in child_environment().items() if not k.startswith("OTEL_")}
    if otlp_endpoint is not None:
        env |= {ENDPOINT_ENV: otlp_endpoint, "LLMMESH_TRACE_SAMPLE_RATIO": "1"}
    return env


async def _ready_value(child: ChildProcess, ready_file: Path, key: str, timeout_s: float) -> str:
    info = await child.wait_ready_file(ready_file, timeout_s)
    value = info.get(key)
    if not isinstance(value, str):
        raise StartupError(child.name, f"the ready file names no {key}", child.log_path)
    return value


@contextlib.asynccontextmanager
async def running_mesh(
    plan: OverheadBenchPlan,
    safety: bool,
    run_dir: Path,
    progress: Progress,
    certs: Path | None = None,
    otlp_endpoint: str | None = None,
) -> AsyncIterator[Mesh]:
    """Start the mesh, the region's safety filters on or off as ``safety``
    says, its planes on mTLS with the certificates in ``certs`` (see
    :func:`issue_mesh_certs`) or, when None, plaintext, tracing to
    ``otlp_endpoint`` when given; wait until the edge's ``/healthz`` says
    the whole path serves, yield it; stop everything on the way out."""
    env = plane_environment(otlp_endpoint)
    launcher = Launcher(run_dir, progress, plan.startup_timeout_s)
    timeout_s = plan.startup_timeout_s
    ready = {name: run_dir / f"{name}.ready.json" for name in ("engine", "region", "edge")}
    for path in ready.values():
        path.unlink(missing_ok=True)
    async with (
        launcher.global_plane(certs, env) as global_address,
        launcher.child("engine", sim_engine_command(plan, ready["engine"], certs), env) as engine,
    ):
        engine_address = await _ready_value(engine, ready["engine"], "address", timeout_s)
        region_argv = region_command(safety, global_address, engine_address, run_dir, ready["region"], certs)
        async with launcher.child("region", region_argv, env) as region:
            region_address = await _ready_value(region, ready["region"], "address", timeout_s)
            edge_argv = edge_command(global_address, ready["edge"], certs)
            async with launcher.child("edge", edge_argv, env) as edge:
                edge_url = await _ready_value(edge, ready["edge"], "url", timeout_s)
                # The region must have reported to geo-routing before the edge can route to it.
                await edge.wait_http_ok(f"{edge_url}/healthz", timeout_s)
                metrics_urls = {
                    "edge": f"{edge_url}/metrics",
                    "region": await _ready_value(region, ready["region"], "metrics_url", timeout_s),
                    "engine": await _ready_value(engine, ready["engine"], "metrics_url", timeout_s),
                }
                yield Mesh(engine_address, region_address, edge_url, certs, metrics_urls, dict(launcher.pids))
