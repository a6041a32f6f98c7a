"""``llmmesh up`` refuses, before it starts anything, a port something else
holds (naming it and the flag that picks another) and a home another
``llmmesh up`` runs on (naming its pid), and leaves that mesh's files be."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmmesh.cli.up_preflight import HomeLock, PreflightError


def up(home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmesh", "up", "--engine", "sim", *flags],
        env={**os.environ, "LLMMESH_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_taken_edge_port_is_named_with_its_flag_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        began = time.monotonic()
        done = up(tmp_path, "--edge-port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"port {port} on 127.0.0.1 is taken: it is the edge's: --edge-port picks another" in done.stderr
    assert "starting" not in done.stderr  # nothing was started first
    assert not (tmp_path / "mesh.json").exists()
    assert time.monotonic() - began < 30


def test_a_second_up_on_a_home_in_use_is_refused_and_leaves_the_first_s_mesh_json(tmp_path: Path) -> None:
    running = HomeLock(tmp_path)
    running.acquire()  # as the first llmmesh up holds it
    mesh_file = tmp_path / "mesh.json"
    mesh_file.write_text(json.dumps({"pid": os.getpid()}))
    try:
        done = up(tmp_path, "--edge-port", "0")
    finally:
        running.release()
    assert done.returncode == 2, done.stderr
    assert f"another llmmesh up (pid {os.getpid()}) runs on {tmp_path}" in done.stderr
    assert json.loads(mesh_file.read_text()) == {"pid": os.getpid()}


def test_the_lock_is_one_holder_s_at_a_time_and_free_again_once_released(tmp_path: Path) -> None:
    first, second = HomeLock(tmp_path), HomeLock(tmp_path)
    first.acquire()
    with pytest.raises(PreflightError, match=f"pid {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
