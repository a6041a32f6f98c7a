"""Child processes: readiness, and stopping the whole process group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmmesh.bench.processes import ChildProcess, StartupError, _live_group_members, free_port

# Starts a grandchild (as vLLM starts its engine core), then reports ready.
SERVE = """
import json, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1] + ".tmp", "w").write(json.dumps({"address": "127.0.0.1:1"}))
__import__("os").replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""
STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write("{}")
time.sleep(120)
"""


def _start(tmp_path: Path, script: str) -> tuple[ChildProcess, Path]:
    ready = tmp_path / "ready.json"
    child = ChildProcess.start("sut", [sys.executable, "-c", script, str(ready)], tmp_path / "sut.log")
    return child, ready


@pytest.mark.asyncio
async def test_ready_file_then_the_whole_group_stops(tmp_path: Path) -> None:
    child, ready = _start(tmp_path, SERVE)
    try:
        info = await child.wait_ready_file(ready, timeout_s=30)
        assert info == {"address": "127.0.0.1:1"}
        assert _live_group_members(child.process.pid) == 2
    finally:
        assert child.stop(grace_s=10)
    assert _live_group_members(child.process.pid) == 0
    assert not child.alive()


@pytest.mark.asyncio
async def test_a_child_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    child, ready = _start(tmp_path, STUBBORN)
    try:
        await child.wait_ready_file(ready, timeout_s=30)
    finally:
        assert child.stop(grace_s=0.5)
    assert child.process.returncode == -9


@pytest.mark.asyncio
async def test_an_early_exit_names_the_log(tmp_path: Path) -> None:
    child, ready = _start(tmp_path, "import sys; print('no model here'); sys.exit(3)")
    try:
        with pytest.raises(StartupError, match=r"sut did not start: exited with status 3") as caught:
            await child.wait_ready_file(ready, timeout_s=30)
    finally:
        child.stop(grace_s=1)
    assert caught.value.log_path == tmp_path / "sut.log"
    assert str(tmp_path / "sut.log") in str(caught.value)
    assert "no model here" in (tmp_path / "sut.log").read_text()


@pytest.mark.asyncio
async def test_health_that_never_comes_times_out(tmp_path: Path) -> None:
    child, _ = _start(tmp_path, "import time; time.sleep(120)")
    url = f"http://127.0.0.1:{free_port()}/health"
    try:
        with pytest.raises(StartupError, match="not healthy within"):
            await child.wait_http_ok(url, timeout_s=0.5)
    finally:
        assert child.stop(grace_s=5)
