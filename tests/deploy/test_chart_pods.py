"""The chart's pods, run as processes: the global plane, an engine pod, and
a region release's region and edge start with exactly the environment the
chart renders for them (only what a cluster provides is stood in for:
loopback and free ports for the pod's interface and ports, temporary files
for the mounted certificates and stores, the global plane's address for its
Service name), answer kubelet's gRPC probe in plaintext while serving mTLS,
and drain to a clean exit on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.bench.processes import free_port
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.topology.mesh_certs import ensure_mesh_certs
from tests.deploy.helm_render import Manifest, example_values, merge, objects, render

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
TLS_MOUNT = "/etc/llmmesh/tls"
TLS_FILES = {"LLMMESH_TLS_CERT": "tls.crt", "LLMMESH_TLS_KEY": "tls.key", "LLMMESH_TLS_CA": "ca.crt"}
# What the chart's pod gets from the cluster, not from its values.
POD_NAME = "llmmesh-engine-sim-0"


def _pod_environment(container: Manifest, certs: dict[str, Path], secrets: dict[str, str]) -> dict[str, str]:
    """The container's env as kubelet would build it: field refs, secret
    refs and ``$(VAR)`` expansion; mounted certificate paths point at ``certs``."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"])
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            value = POD_NAME
        else:
            value = secrets[item["valueFrom"]["secretKeyRef"]["key"]]
        env[item["name"]] = value
    for name, key in (
        ("LLMMESH_TLS_CERT", "tls.crt"),
        ("LLMMESH_TLS_KEY", "tls.key"),
        ("LLMMESH_TLS_CA", "ca.crt"),
    ):
        assert env[name] == f"{TLS_MOUNT}/{key}"
        env[name] = str(certs[key])
    return env


def _probe(port: int) -> int:
    """kubelet's gRPC probe: plaintext grpc.health.v1 Check of the server."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return -1
        status: int = reply.status
        return status


def _wait_serving(process: subprocess.Popen[str], used: dict[str, str], attempts: int = 120) -> None:
    """Until the process says it serves (its ready file: a port picked free
    may since answer for another test's process) and its probe port answers SERVING."""
    port = int(used["LLMMESH_PROBE_PORT"])
    for _ in range(attempts):
        assert process.poll() is None, process.communicate()[1]
        if Path(used["LLMMESH_READY_FILE"]).exists() and _probe(port) == SERVING:
            return
        time.sleep(0.5)
    raise AssertionError(f"the probe port {port} never answered SERVING")


@contextmanager
def _started(
    container: Manifest, env: dict[str, str], home: Path
) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """The container's command as a process, with its environment."""
    # Interfaces and ports a pod has to itself are shared on this machine.
    env = env | {"LLMMESH_HOST": "127.0.0.1", "LLMMESH_PORT": str(free_port())}
    env |= {name: str(free_port()) for name in ("LLMMESH_PROBE_PORT", "LLMMESH_METRICS_PORT") if name in env}
    home.mkdir(parents=True, exist_ok=True)
    env["LLMMESH_READY_FILE"] = str(home / "ready.json")
    # The image's environment (Dockerfile) under the container's own.
    full = {"PATH": os.environ["PATH"], "LLMMESH_HOME": str(home), "PYTHONHASHSEED": "0", **env}
    argv = [sys.executable, "-m", "llmmesh", *container["args"]]
    process = subprocess.Popen(argv, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield process, env
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def _serves_probes_and_drains(container: Manifest, env: dict[str, str], home: Path) -> None:
    with _started(container, env, home) as (process, used):
        _wait_serving(process, used)
        # The plane's own port refuses plaintext: it serves mTLS only.
        assert _probe(int(used["LLMMESH_PORT"])) == -1
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr


def _containers(values: dict[str, Any]) -> dict[str, Manifest]:
    """Each plane's main container, by its command."""
    manifests = render(values, name="llmmesh", namespace="llmmesh")
    workloads = [*objects(manifests, "Deployment").values(), *objects(manifests, "StatefulSet").values()]
    found = [w["spec"]["template"]["spec"]["containers"][0] for w in workloads]
    return {c["args"][0]: c for c in found}


def _certs(root: Path, identity: PlaneIdentity) -> dict[str, Path]:
    (files,) = ensure_mesh_certs(root, [identity]).values()
    return {"tls.crt": files.cert, "tls.key": files.key, "ca.crt": files.ca}


def test_the_global_plane_pod_starts_answers_its_probe_and_drains(tmp_path: Path) -> None:
    container = _containers({"globalPlane": {"enabled": True}})["global"]
    certs = _certs(tmp_path / "certs", PlaneIdentity(Role.GLOBAL, "global"))
    secrets = {"database-url": f"sqlite:///{tmp_path / 'global.db'}"}
    env = _pod_environment(container, certs, secrets)
    assert env["LLMMESH_DEV_KEY"] == ""
    _serves_probes_and_drains(container, env, tmp_path)


def test_an_engine_pod_starts_answers_its_probe_and_drains(tmp_path: Path) -> None:
    pool = {"name": "sim", "model": "llmmesh-tiny", "backend": "sim", "replicas": 1}
    values = merge({"region": {"enabled": True}}, {"engine": {"pools": [pool]}})
    container = _containers(values)["engine"]
    identity = PlaneIdentity(Role.ENGINE, POD_NAME, "us", "us-east")
    env = _pod_environment(container, _certs(tmp_path / "certs", identity), {})
    assert env["LLMMESH_ADVERTISE_ADDRESS"] == (
        f"{POD_NAME}.llmmesh-engine-sim.llmmesh.svc.cluster.local:50061"
    )
    _serves_probes_and_drains(container, env, tmp_path)


def test_a_region_release_s_region_and_edge_start_against_the_global_plane(tmp_path: Path) -> None:
    """Region and edge of values-us.yaml, with the global plane of
    values-global.yaml: the region registers (its engine pods, not running
    here, count as down), its probe answers, and the edge serves HTTP."""
    certs_dir = tmp_path / "certs"
    planes = _containers(merge(example_values("values-us.yaml"), {"globalPlane": {"enabled": True}}))
    global_env = _pod_environment(
        planes["global"],
        _certs(certs_dir, PlaneIdentity(Role.GLOBAL, "global")),
        {"database-url": f"sqlite:///{tmp_path / 'global.db'}"},
    )
    zone = {"zone-store-url": f"sqlite:///{tmp_path / 'zone-us.db'}", "redis-url": ""}
    region_env = _pod_environment(
        planes["region"], _certs(certs_dir, PlaneIdentity(Role.REGION, "us-east", "us", "us-east")), zone
    )
    edge_env = _pod_environment(planes["edge"], _certs(certs_dir, PlaneIdentity(Role.EDGE, "edge")), zone)
    assert region_env["LLMMESH_ENGINE_ADDRESSES"].count(",") == 8 + 4 - 1  # both pools' maxReplicas
    with _started(planes["global"], global_env, tmp_path / "global") as (glob, glob_env):
        _wait_serving(glob, glob_env)
        # The cluster's Service name stands for the global plane's address.
        address = f"127.0.0.1:{glob_env['LLMMESH_PORT']}"
        region_env["LLMMESH_GLOBAL_ADDRESS"] = edge_env["LLMMESH_GLOBAL_ADDRESS"] = address
        with _started(planes["region"], region_env, tmp_path / "region") as (region, used):
            _wait_serving(region, used)
            with _started(planes["edge"], edge_env, tmp_path / "edge") as (edge, edge_used):
                base = f"http://127.0.0.1:{edge_used['LLMMESH_PORT']}"
                _wait_http_ok(edge, f"{base}/readyz", Path(edge_used["LLMMESH_READY_FILE"]))
                # The region registered with the global plane, in its zone.
                assert _registered_zone(base, "us-east") == "us"
                for process in (edge, region):
                    process.send_signal(signal.SIGTERM)
                    _, stderr = process.communicate(timeout=60)
                    assert process.returncode == 0, stderr


def _wait_http_ok(process: subprocess.Popen[str], url: str, ready: Path, attempts: int = 120) -> None:
    for _ in range(attempts):
        assert process.poll() is None, process.communicate()[1]
        try:
            if ready.exists() and httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} never answered 200")


def _registered_zone(edge_url: str, region: str, attempts: int = 60) -> str:
    """The zone the global plane's directory lists ``region`` in, as the edge's health shows it."""
    for _ in range(attempts):
        regions = httpx.get(f"{edge_url}/healthz", timeout=10).json()["regions"]
        if region in regions:
            zone: str = regions[region]["zone"]
            return zone
        time.sleep(0.5)
    raise AssertionError(f"{region} never appeared in the region directory")
