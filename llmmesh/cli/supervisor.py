"""The child processes of ``llmmesh up``: each plane is ``llmmesh <plane>``,
started in its own session, ready once it writes its ready file, and
stopped kind by kind in the reverse of the start order.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0
"""Longest one plane, or one group of planes started together, may take to become ready."""
STOP_GRACE_S = 15.0
"""Longest the planes of one kind may take to drain after SIGTERM before they are killed."""
STOP_ORDER = ("edge", "region", "engine", "global")
"""The reverse of the start order: nothing is stopped before what depends on it."""
_PR_SET_PDEATHSIG = 1


class MeshStartError(Exception):
    """A plane failed to start, or the start was interrupted."""


def _die_with_parent() -> None:
    # A child outliving a SIGKILLed supervisor would hold its port forever.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Plane:
    """One child process of the mesh."""

    name: str
    """What progress lines and reports call it: "global plane", "region eu-west"…"""
    kind: str
    """The ``llmmesh`` command it runs: global, engine, region or edge."""
    argv: list[str]
    process: subprocess.Popen[bytes]
    ready_file: Path
    info: dict[str, object] = field(default_factory=dict)
    """What it wrote to its ready file (its address, …)."""
    reported: bool = False
    """Whether its exit was already reported."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def address(self) -> str:
        return str(self.info["address"])


class Supervisor:
    """Starts planes as child processes, reports the ones that exit, and stops them all."""

    def __init__(self, run_dir: Path, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.run_dir = run_dir
        self.startup_timeout_s = startup_timeout_s
        self.planes: list[Plane] = []
        self.stopping = False

    def launch(self, name: str, kind: str, *flags: str, env: Mapping[str, str] | None = None) -> Plane:
        """Start ``llmmesh KIND FLAGS --ready-file …`` without waiting for it.

        ``env`` adds to this process's environment: the place for settings
        that may hold a password (URLs), which flags would show to ``ps``.
        """
        ready = self.run_dir / f"{name.replace(' ', '-')}.ready.json"
        argv = [sys.executable, "-m", "llmmesh", kind, *flags, "--ready-file", str(ready)]
        process = subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=_die_with_parent
        )
        plane = Plane(name, kind, argv, process, ready)
        self.planes.append(plane)
        return plane

    def wait_ready(self, planes: Sequence[Plane]) -> None:
        """Wait until every plane of ``planes`` wrote its ready file; MeshStartError
        when one exits first, the time runs out or a stop is asked for."""
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(planes)
        while pending:
            if self.stopping:
                raise MeshStartError("interrupted")
            for plane in pending:
                if not plane.alive():
                    plane.reported = True
                    raise MeshStartError(
                        f"{plane.name} exited with status {plane.process.returncode} during startup"
                    )
            if time.monotonic() > deadline:
                names = ", ".join(p.name for p in pending)
                raise MeshStartError(f"{names} did not become ready within {self.startup_timeout_s:.0f} s")
            ready = [p for p in pending if p.ready_file.exists()]
            for plane in ready:
                plane.info = json.loads(plane.ready_file.read_text())
                pending.remove(plane)
            if pending:
                time.sleep(0.05)

    def start(self, name: str, kind: str, *flags: str, env: Mapping[str, str] | None = None) -> Plane:
        """:meth:`launch` and wait until ready."""
        plane = self.launch(name, kind, *flags, env=env)
        self.wait_ready([plane])
        return plane

    def newly_exited(self) -> list[Plane]:
        """Planes that exited since the last call, each returned once."""
        exited = [p for p in self.planes if not p.reported and not p.alive()]
        for plane in exited:
            plane.reported = True
        return exited

    def stop_all(self) -> None:
        """SIGTERM kind by kind (:data:`STOP_ORDER`); SIGKILL whatever outlives the grace."""
        for kind in STOP_ORDER:
            group = [p for p in reversed(self.planes) if p.kind == kind and p.alive()]
            for plane in group:
                plane.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for plane in group:
                try:
                    plane.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    print(f"llmmesh up: {plane.name} did not stop in time; killing it", file=sys.stderr)
                    plane.process.kill()
                    plane.process.wait()
