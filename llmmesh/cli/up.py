"""``llmmesh up``: the embedded mesh, every plane its own process on
localhost, started in dependency order and stopped in reverse.

The addresses of every plane and the dev API key go to
``$LLMMESH_HOME/mesh.json`` (default ``~/.llmmesh``), which the other
commands read.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from llmmesh.home import mesh_home

STARTUP_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="engine backend of the pods; vllm serves llmmesh-tiny, built on first use",
    )
    parser.add_argument(
        "--edge-port", type=int, default=8080, help="HTTP port of the edge; 0 picks a free one"
    )
    parser.add_argument("--dev-key", default="sk-llmmesh-dev", help="API key of the development tenant")
    parser.add_argument("--host", default="127.0.0.1", help="address every plane binds")
    parser.add_argument("--region", default="us-east", help="name of the embedded region")
    parser.add_argument("--zone", default="us", help="zone of the embedded region and the dev tenant")


class MeshStartError(Exception):
    """A plane failed to start."""


def _die_with_parent() -> None:
    # A child outliving a SIGKILLed supervisor would hold its port forever.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Plane:
    """One child process of the mesh."""

    name: str
    process: subprocess.Popen[bytes]
    ready_file: Path
    info: dict[str, object]

    def alive(self) -> bool:
        return self.process.poll() is None


class Supervisor:
    """Starts planes as child processes and stops them all."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.planes: list[Plane] = []
        self.stopping = False

    def start(self, name: str, command: str, *flags: str) -> Plane:
        """Start ``llmmesh COMMAND FLAGS`` and wait until it reports ready."""
        ready = self.run_dir / f"{name}.ready.json"
        argv = [sys.executable, "-m", "llmmesh", command, *flags, "--ready-file", str(ready)]
        process = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent)
        plane = Plane(name, process, ready, {})
        self.planes.append(plane)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready.exists():
            if self.stopping:
                raise MeshStartError("interrupted")
            if not plane.alive():
                raise MeshStartError(f"{name} exited with status {process.returncode} during startup")
            if time.monotonic() > deadline:
                raise MeshStartError(f"{name} did not become ready within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        plane.info = json.loads(ready.read_text())
        return plane

    def first_exited(self) -> Plane | None:
        return next((p for p in self.planes if not p.alive()), None)

    def stop_all(self) -> None:
        """SIGTERM in reverse start order, then SIGKILL whatever outlives the grace."""
        for plane in reversed(self.planes):
            if plane.alive():
                plane.process.send_signal(signal.SIGTERM)
                try:
                    plane.process.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    print(f"llmmesh up: {plane.name} did not stop in time; killing it", file=sys.stderr)
                    plane.process.kill()
                    plane.process.wait()


def _wait_healthy(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


def _start_mesh(sup: Supervisor, args: argparse.Namespace) -> dict[str, object]:
    host = args.host
    glob = sup.start(
        "global", "global", "--host", host, "--port", "0", "--dev-key", args.dev_key, "--dev-zone", args.zone
    )
    pod_id = f"{args.region}-pod-0"
    engine = sup.start(
        "engine", "engine", "--host", host, "--port", "0", "--backend", args.engine, "--pod-id", pod_id
    )
    region = sup.start(
        "region",
        "region",
        "--host", host,
        "--port", "0",
        "--region", args.region,
        "--zone", args.zone,
        "--global-address", str(glob.info["address"]),
        "--engine-addresses", str(engine.info["address"]),
    )  # fmt: skip
    edge = sup.start(
        "edge",
        "edge",
        "--host",
        host,
        "--port",
        str(args.edge_port),
        "--global-address",
        str(glob.info["address"]),
    )
    return {
        "pid": os.getpid(),
        "edge_url": edge.info["url"],
        "api_key": args.dev_key,
        "global_address": glob.info["address"],
        "engine_backend": args.engine,
        "regions": [
            {
                "region": args.region,
                "zone": args.zone,
                "address": region.info["address"],
                "engines": [
                    {
                        "pod_id": pod_id,
                        "address": engine.info["address"],
                        "metrics_url": engine.info["metrics_url"],
                    }
                ],
            }
        ],
    }


def run_up(args: argparse.Namespace) -> int:
    """Run the mesh until Ctrl-C or SIGTERM; nothing is left running after."""
    home = mesh_home()
    home.mkdir(parents=True, exist_ok=True)
    mesh_file = home / "mesh.json"
    with tempfile.TemporaryDirectory(prefix="llmmesh-up-") as run_dir:
        sup = Supervisor(Path(run_dir))

        def on_signal(signum: int, frame: types.FrameType | None) -> None:
            sup.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        status = 0
        try:
            mesh = _start_mesh(sup, args)
            mesh_file.write_text(json.dumps(mesh, indent=2) + "\n")
            healthy = _wait_healthy(str(mesh["edge_url"]), 15.0)
            _print_summary(mesh, mesh_file, healthy)
            while not sup.stopping:
                exited = sup.first_exited()
                if exited is not None:
                    code = exited.process.returncode
                    print(f"llmmesh up: {exited.name} exited with status {code}; stopping", file=sys.stderr)
                    status = 1
                    break
                time.sleep(0.2)
        except MeshStartError as err:
            if not sup.stopping:
                print(f"llmmesh up: {err}", file=sys.stderr)
                status = 1
        finally:
            print("llmmesh up: stopping", file=sys.stderr, flush=True)
            sup.stop_all()
            _remove_if_ours(mesh_file)
    return status


def _remove_if_ours(mesh_file: Path) -> None:
    try:
        if json.loads(mesh_file.read_text()).get("pid") == os.getpid():
            mesh_file.unlink()
    except (OSError, ValueError):
        pass


def _print_summary(mesh: dict[str, object], mesh_file: Path, healthy: bool) -> None:
    regions = mesh["regions"]
    assert isinstance(regions, list)
    lines = [
        "llmmesh is up" + ("" if healthy else " (but /healthz does not answer 200 yet)"),
        f"  global plane   {mesh['global_address']}",
    ]
    for region in regions:
        lines.append(f"  region         {region['region']} (zone {region['zone']})  {region['address']}")
        for pod in region["engines"]:
            lines.append(f"  engine pod     {pod['pod_id']} ({mesh['engine_backend']})  {pod['address']}")
            lines.append(f"  pod metrics    {pod['metrics_url']}")
    lines += [
        f"  edge           {mesh['edge_url']}",
        f"  OpenAI base    {mesh['edge_url']}/v1",
        f"  dev API key    {mesh['api_key']}",
        f"  written to     {mesh_file}",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)
