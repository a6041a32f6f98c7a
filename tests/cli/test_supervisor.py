"""``llmmesh up``'s supervisor: pinned ports, restarts with backoff, giving up,
and leaving a stopped process alone; on ``sleep`` processes, no mesh."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmmesh.cli.supervisor import Plane, RestartPolicy, Supervisor

SLEEP = shutil.which("sleep") or "/bin/sleep"
BOUND_S = 10.0


def ready() -> dict[str, object]:
    return {"address": "127.0.0.1:1"}


class Reported(list[str]):
    """The supervisor's report lines."""


@pytest.fixture
def lines() -> Reported:
    return Reported()


@pytest.fixture
def sup(tmp_path: Path, lines: Reported) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path, 10.0, RestartPolicy(first_delay_s=0.05, max_attempts=2), lines.append)
    yield supervisor
    supervisor.stop_all()


def test_restart_delays_double_up_to_the_cap() -> None:
    policy = RestartPolicy(first_delay_s=0.5, max_delay_s=3.0)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_ports_a_plane_bound_replace_port_zero_in_its_command_line(tmp_path: Path) -> None:
    argv = ["llmmesh", "engine", "--port", "0", "--metrics-port", "0"]
    plane = Plane("engine pod p", "engine", argv, None, None)  # type: ignore[arg-type]
    plane.info = {"address": "127.0.0.1:50061", "metrics_url": "http://127.0.0.1:9400/metrics"}
    plane.pin_ports()
    assert plane.argv == ["llmmesh", "engine", "--port", "50061", "--metrics-port", "9400"]
    edge = Plane("edge", "edge", ["llmmesh", "edge", "--port", "0"], None, None)  # type: ignore[arg-type]
    edge.info = {"url": "http://127.0.0.1:8081"}
    edge.pin_ports()
    assert edge.argv[-1] == "8081"


def test_a_killed_plane_is_restarted_with_the_same_command_line(sup: Supervisor, lines: Reported) -> None:
    plane = sup.launch_program("region r", "region", [SLEEP, "60"], ready)
    sup.wait_ready([plane])
    first = plane.pid
    os.kill(first, signal.SIGKILL)
    restarted: list[Plane] = []
    deadline = time.monotonic() + BOUND_S
    while not restarted:
        assert time.monotonic() < deadline, lines
        sup.tend(restarted.append)
        time.sleep(0.02)
    assert restarted == [plane] and plane.pid != first and plane.alive()
    assert plane.ready_pid == plane.pid and plane.argv == [SLEEP, "60"]
    assert (
        f"region r (pid {first}) exited with status -9; restarting it in 0.1 s (restart 1 in a row)" in lines
    )
    assert f"region r restarted (pid {plane.pid})" in lines


def test_a_plane_that_keeps_exiting_is_given_up_on(sup: Supervisor, lines: Reported) -> None:
    plane = sup.launch_program("region r", "region", [SLEEP, "0"], lambda: None)
    given_up: list[Plane] = []
    deadline = time.monotonic() + BOUND_S
    while not given_up:
        assert time.monotonic() < deadline, lines
        given_up += sup.tend(lambda p: None)
        time.sleep(0.02)
    assert given_up == [plane] and plane.given_up
    assert lines[-1].endswith("given up after 2 restarts in a row; the mesh goes on without it")


def test_a_stopped_plane_is_left_alone(sup: Supervisor, lines: Reported) -> None:
    plane = sup.launch_program("region r", "region", [SLEEP, "60"], ready)
    sup.wait_ready([plane])
    os.kill(plane.pid, signal.SIGSTOP)
    try:
        for _ in range(10):
            assert sup.tend(lambda p: None) == []
            time.sleep(0.02)
        assert plane.alive() and plane.restart_due is None
        assert lines == []
    finally:
        os.kill(plane.pid, signal.SIGCONT)


def test_without_restarts_an_exit_is_reported_and_left(tmp_path: Path) -> None:
    lines: list[str] = []
    sup = Supervisor(tmp_path, 10.0, RestartPolicy(enabled=False), lines.append)
    try:
        plane = sup.launch_program("region r", "region", [SLEEP, "60"], ready)
        sup.wait_ready([plane])
        pid = plane.pid
        os.kill(pid, signal.SIGKILL)
        plane.process.wait(BOUND_S)
        assert sup.tend(lambda p: None) == [plane]
        assert lines == [f"region r (pid {pid}) exited with status -9; the mesh goes on without it"]
    finally:
        sup.stop_all()
