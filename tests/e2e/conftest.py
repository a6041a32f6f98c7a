"""Fixtures that start the mesh as real processes, and readers of what the
running mesh holds: its zone stores' request logs and its pods' counters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import httpx
import pytest
import sqlalchemy as sa

from llmmesh.core.grpcserver import open_channel
from llmmesh.core.mtls import holder_security
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.zone_store import schema
from tests.e2e.span_sink import SpanSink, serving_span_sink

# Ten processes (global plane, four pods, four regions, edge) on two shared cores.
STARTUP_TIMEOUT_S = 240.0


@dataclass
class RunningMesh:
    """A running ``llmmesh up`` and what it wrote to mesh.json."""

    process: subprocess.Popen[str]
    info: dict[str, object]
    home: Path

    def log(self) -> str:
        return (self.home / "up.log").read_text(errors="replace")

    @property
    def edge_url(self) -> str:
        return str(self.info["edge_url"])

    @property
    def api_key(self) -> str:
        return str(self.info["api_key"])

    def key(self, zone: str) -> str:
        """The API key of the dev tenant pinned to ``zone``."""
        keys = self.info["keys"]
        assert isinstance(keys, dict)
        return str(keys[zone])

    def tenant_id(self, zone: str) -> str:
        """The id of the dev tenant pinned to ``zone``."""
        tenants = self.info["tenants"]
        assert isinstance(tenants, dict)
        return str(tenants[zone]["id"])

    def zone_of(self) -> dict[str, str]:
        """Every region's zone."""
        regions = self.info["regions"]
        assert isinstance(regions, list)
        return {str(r["region"]): str(r["zone"]) for r in regions}

    def regions_in(self, zone: str) -> set[str]:
        return {region for region, of in self.zone_of().items() if of == zone}

    def store_url(self, zone: str) -> str:
        zones = self.info["zones"]
        assert isinstance(zones, dict)
        return str(zones[zone]["store_url"])

    @property
    def pids(self) -> dict[str, int]:
        """Process ids by plane: "global", "edge", each region and each pod."""
        pids = self.info["pids"]
        assert isinstance(pids, dict)
        return {str(plane): int(pid) for plane, pid in pids.items()}

    @property
    def certs_dir(self) -> Path:
        """Where ``llmmesh up`` keeps the mesh's certificates (mesh.json's ``tls`` entry)."""
        tls = self.info["tls"]
        assert isinstance(tls, dict) and not tls["insecure"], tls
        return Path(str(tls["certs_dir"]))

    def channel(self, address: str, server_name: str, holder: str = "admin") -> grpc.aio.Channel:
        """A gRPC channel to a plane of the mesh, presenting the mesh's ``holder``
        certificate (admin, client) and expecting the server to answer to
        ``server_name`` (:func:`llmmesh.core.identity.role_name`): the planes talk mTLS only."""
        return open_channel(address, holder_security(holder, directory=self.certs_dir), server_name)

    def pod_metrics_urls(self, zone: str) -> list[str]:
        regions = self.info["regions"]
        assert isinstance(regions, list)
        return [str(pod["metrics_url"]) for r in regions if r["zone"] == zone for pod in r["engines"]]


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def served_requests(store_url: str) -> dict[str, set[str]]:
    """A zone store's request log: the request ids of the turns its usage outbox
    holds, by the region that ran them."""
    served: dict[str, set[str]] = {}
    engine = create_store_engine(store_url)
    try:
        with engine.connect() as conn:
            outbox = schema.usage_outbox
            for request_id, region in conn.execute(sa.select(outbox.c.request_id, outbox.c.home_region)):
                served.setdefault(region, set()).add(request_id)
    finally:
        engine.dispose()
    return served


TENANT_TABLES = [table for table in schema.ZONE_TABLES if "tenant_id" in table.c]
"""The zone tables whose rows are a tenant's (the others are the zone's own, like its keys)."""

NO_TENANT_ROWS: dict[str, list[dict[str, object]]] = {table.name: [] for table in TENANT_TABLES}
"""What :func:`tenant_rows` finds of a tenant a zone store never saw."""


def tenant_rows(store_url: str, tenant_id: str) -> dict[str, list[dict[str, object]]]:
    """Every row of ``tenant_id`` in a zone store, by table."""
    engine = create_store_engine(store_url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    dict(row._mapping)
                    for row in conn.execute(table.select().where(table.c.tenant_id == tenant_id))
                ]
                for table in TENANT_TABLES
            }
    finally:
        engine.dispose()


def pod_counters(metrics_urls: list[str]) -> tuple[float, float]:
    """Requests finished and prompt tokens processed, summed over the pods at ``metrics_urls``."""
    finished = prompt = 0.0
    for url in metrics_urls:
        for line in httpx.get(url, timeout=10).text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("vllm:request_success_total"):
                finished += float(value)
            elif name.startswith("vllm:prompt_tokens_total"):
                prompt += float(value)
    return finished, prompt


def start_up(home: Path, *flags: str, otlp_endpoint: str = "") -> RunningMesh:
    """Start ``llmmesh up`` and wait for its mesh.json; with ``otlp_endpoint``,
    every plane exports every span there."""
    env = {**os.environ, "LLMMESH_HOME": str(home)}
    tracing = ["--otlp-endpoint", otlp_endpoint, "--trace-sample-ratio", "1"] if otlp_endpoint else []
    if otlp_endpoint:
        # Export batches every half second (OpenTelemetry's default: 5 s), so spans arrive while a test waits.
        env["OTEL_BSP_SCHEDULE_DELAY"] = "500"
    # A file, not a pipe: every plane logs to it, and nobody drains a pipe.
    with (home / "up.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmmesh", *tracing, "up", *flags],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    mesh_file = home / "mesh.json"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not mesh_file.exists():
        if process.poll() is not None:
            out = (home / "up.log").read_text(errors="replace")
            raise AssertionError(f"llmmesh up exited with {process.returncode}:\n{out}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("llmmesh up did not write mesh.json in time")
        time.sleep(0.1)
    return RunningMesh(process, json.loads(mesh_file.read_text()), home)


def stop_up(mesh: RunningMesh) -> tuple[int, str]:
    """SIGTERM the mesh; return its exit status and output."""
    mesh.process.send_signal(signal.SIGTERM)
    mesh.process.wait(timeout=60)
    return mesh.process.returncode, mesh.log()


@pytest.fixture(scope="package")
def span_sink() -> Iterator[SpanSink]:
    """The trace collector the shared mesh exports every span of every plane to."""
    with serving_span_sink() as sink:
        yield sink


@pytest.fixture(scope="package")
def mesh(tmp_path_factory: pytest.TempPathFactory, span_sink: SpanSink) -> Iterator[RunningMesh]:
    """One embedded mesh (simulator engine) shared by the end-to-end tests,
    tracing every turn (sample ratio 1) to :func:`span_sink`."""
    running = start_up(
        tmp_path_factory.mktemp("llmmesh-home"),
        "--engine",
        "sim",
        "--edge-port",
        "0",
        "--dev-key",
        "sk-llmmesh-e2e",
        otlp_endpoint=span_sink.endpoint,
    )
    yield running
    if running.process.poll() is None:
        status, out = stop_up(running)
        assert status == 0, out
