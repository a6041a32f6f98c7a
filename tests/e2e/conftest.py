"""Fixtures that start the mesh as real processes."""

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

import pytest

STARTUP_TIMEOUT_S = 120.0


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


def start_up(home: Path, *flags: str) -> RunningMesh:
    """Start ``llmmesh up`` and wait for its mesh.json."""
    env = {**os.environ, "LLMMESH_HOME": str(home)}
    # A file, not a pipe: every plane logs to it, and nobody drains a pipe.
    with (home / "up.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmmesh", "up", *flags],
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
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """One embedded mesh (simulator engine) shared by the end-to-end tests."""
    running = start_up(
        tmp_path_factory.mktemp("llmmesh-home"),
        "--engine",
        "sim",
        "--edge-port",
        "0",
        "--dev-key",
        "sk-llmmesh-e2e",
    )
    yield running
    if running.process.poll() is None:
        status, out = stop_up(running)
        assert status == 0, out
