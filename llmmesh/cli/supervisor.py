"""The child processes of ``llmmesh up``: each plane is ``llmmesh <plane>``
(or, for an embedded Redis, ``redis-server``), started in its own session,
ready once it writes its ready file (or answers its probe), restarted under
a :class:`RestartPolicy` when it exits on its own, and stopped kind by kind
in the reverse of the start order.

Restarts keep the address: a plane started on port 0 has the port it bound
written into its command line once it is ready (:meth:`Plane.pin_ports`),
so a restart binds the same port and every peer that knows the address
reaches the new process. The OS picks the first port (no race with another
process between choosing a port and binding it); only the restart needs it
to stay the same. A stopped (SIGSTOP) process has not exited and is never
restarted.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

STARTUP_TIMEOUT_S = 120.0
"""Longest one plane, or one group of planes started together, may take to become ready."""
STOP_GRACE_S = 15.0
"""Longest the planes of one kind may take to drain after SIGTERM before they are killed."""
STOP_ORDER = ("edge", "region", "engine", "global", "redis")
"""The reverse of the start order: nothing is stopped before what depends on it."""
_PR_SET_PDEATHSIG = 1
_PORT_FLAGS = {"--port": ("address", "url"), "--metrics-port": ("metrics_url",)}
"""Port flags of a plane's command line, and the ready-file keys that tell the port it bound."""


class MeshStartError(Exception):
    """A plane failed to start, or the start was interrupted."""


def _die_with_parent() -> None:
    # A child outliving a SIGKILLed supervisor would hold its port forever.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class RestartPolicy:
    """When a plane that exited on its own is started again.

    The n-th restart in a row waits ``first_delay_s * 2**(n-1)`` (at most
    ``max_delay_s``); a plane that stayed up ``stable_after_s`` starts its
    count over, and one that needed more than ``max_attempts`` restarts in
    a row is given up on (reported; the mesh goes on without it).
    """

    enabled: bool = True
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0
    stable_after_s: float = 30.0
    max_attempts: int = 10

    def delay_s(self, attempt: int) -> float:
        """The wait before restart number ``attempt`` (1 for the first) of a row."""
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** max(0, attempt - 1)))


Probe = Callable[[], dict[str, object] | None]
"""Tells whether a plane without a ready file serves: its info, or None while it does not."""


@dataclass
class Plane:
    """One child process of the mesh."""

    name: str
    """What progress lines and reports call it: "global plane", "region eu-west"…"""
    kind: str
    """The ``llmmesh`` command it runs (global, engine, region or edge), or redis."""
    argv: list[str]
    process: subprocess.Popen[bytes]
    ready_file: Path | None
    env: dict[str, str] = field(default_factory=dict)
    """What its environment adds to the supervisor's; a restart gets the same."""
    probe: Probe | None = None
    """Readiness of a plane that writes no ready file."""
    info: dict[str, object] = field(default_factory=dict)
    """What it wrote to its ready file (its address, …); a restart keeps its ports, so its address."""
    reported: bool = False
    """Whether its exit was already reported."""
    ready_at: float | None = None
    """When it last became ready (monotonic); None while it starts."""
    ready_pid: int = 0
    """The pid of the process that last became ready: what ``mesh.json`` names."""
    attempts: int = 0
    """Restarts in a row that did not stay up :attr:`RestartPolicy.stable_after_s`."""
    restart_due: float | None = None
    """When its scheduled restart is due (monotonic)."""
    launched_at: float = field(default_factory=time.monotonic)
    given_up: bool = False
    """Exited and not restarted: the policy is off or its restarts ran out."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def address(self) -> str:
        return str(self.info["address"])

    def poll_ready(self) -> bool:
        """Whether it serves now; reads its info the first time it does."""
        if self.probe is not None:
            info = self.probe()
            if info is None:
                return False
            self.info = info
        elif self.ready_file is not None and self.ready_file.exists():
            self.info = json.loads(self.ready_file.read_text())
        else:
            return False
        self.ready_at = time.monotonic()
        self.ready_pid = self.pid
        self.pin_ports()
        return True

    def pin_ports(self) -> None:
        """Put the ports it bound in place of ``0`` in its command line."""
        for index, flag in enumerate(self.argv[:-1]):
            if flag not in _PORT_FLAGS or self.argv[index + 1] != "0":
                continue
            for key in _PORT_FLAGS[flag]:
                port = _port_of(self.info.get(key))
                if port:
                    self.argv[index + 1] = str(port)
                    break


def _port_of(value: object) -> int | None:
    """The port of ``host:port`` or of a URL."""
    if not isinstance(value, str) or not value:
        return None
    text = value if "://" in value else f"//{value}"
    try:
        return urlsplit(text).port
    except ValueError:
        return None


class Supervisor:
    """Starts planes as child processes, reports (and restarts) the ones that exit, and stops them all."""

    def __init__(
        self,
        run_dir: Path,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        policy: RestartPolicy | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.startup_timeout_s = startup_timeout_s
        self.policy = policy or RestartPolicy(enabled=False)
        self.report = report or (lambda text: print(f"llmmesh up: {text}", file=sys.stderr, flush=True))
        self.planes: list[Plane] = []
        self.stopping = False

    def launch(
        self,
        name: str,
        kind: str,
        *flags: str,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Plane:
        """Start ``llmmesh KIND FLAGS --ready-file …`` without waiting for it.

        ``env`` adds to this process's environment: the place for settings
        that may hold a password (URLs), which flags would show to ``ps``.
        ``prefix`` runs it through another command that execs it (``ip netns
        exec NS``: on a host of :mod:`llmmesh.topology.netns`); restarts keep it.
        """
        ready = self.run_dir / f"{name.replace(' ', '-')}.ready.json"
        argv = [*prefix, sys.executable, "-m", "llmmesh", kind, *flags, "--ready-file", str(ready)]
        return self._add(Plane(name, kind, argv, _spawn(argv, env or {}), ready, dict(env or {})))

    def launch_program(self, name: str, kind: str, argv: Sequence[str], probe: Probe) -> Plane:
        """Start a program that is not an ``llmmesh`` plane; ``probe`` tells when it serves."""
        return self._add(Plane(name, kind, list(argv), _spawn(argv, {}), None, probe=probe))

    def _add(self, plane: Plane) -> Plane:
        self.planes.append(plane)
        return plane

    def wait_ready(self, planes: Sequence[Plane]) -> None:
        """Wait until every plane of ``planes`` is ready; MeshStartError
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
            pending = [p for p in pending if not p.poll_ready()]
            if pending:
                time.sleep(0.05)

    def start(
        self,
        name: str,
        kind: str,
        *flags: str,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Plane:
        """:meth:`launch` and wait until ready."""
        plane = self.launch(name, kind, *flags, env=env, prefix=prefix)
        self.wait_ready([plane])
        return plane

    def newly_exited(self) -> list[Plane]:
        """Planes that exited since the last call, each returned once."""
        exited = [p for p in self.planes if not p.reported and not p.alive()]
        for plane in exited:
            plane.reported = True
        return exited

    def tend(self, on_restarted: Callable[[Plane], None]) -> list[Plane]:
        """One round of supervision: report planes that exited and schedule
        their restarts, start the restarts that are due, and call
        ``on_restarted`` for each restarted plane that became ready.
        Returns the planes given up on in this round."""
        now = time.monotonic()
        given_up = [plane for plane in self.newly_exited() if not self._schedule(plane, now)]
        for plane in self.planes:
            if plane.restart_due is not None and now >= plane.restart_due and not self.stopping:
                self._relaunch(plane)
            elif plane.restart_due is None and plane.ready_at is None and not plane.given_up:
                if plane.alive() and plane.poll_ready():
                    self.report(f"{plane.name} restarted (pid {plane.pid})")
                    on_restarted(plane)
                elif plane.alive() and now - plane.launched_at > self.startup_timeout_s:
                    self.report(f"{plane.name} (pid {plane.pid}) did not become ready in time; killing it")
                    plane.process.kill()
        return given_up

    def _schedule(self, plane: Plane, now: float) -> bool:
        """Schedule the restart of ``plane``, which exited; False when it is given up on."""
        code = plane.process.returncode
        exited = f"{plane.name} (pid {plane.pid}) exited with status {code}"
        policy = self.policy
        if plane.ready_at is not None and now - plane.ready_at >= policy.stable_after_s:
            plane.attempts = 0
        plane.ready_at = None
        if not policy.enabled or plane.attempts >= policy.max_attempts or self.stopping:
            plane.given_up = True
            why = f"; given up after {plane.attempts} restarts in a row" if policy.enabled else ""
            self.report(f"{exited}{why}; the mesh goes on without it")
            return False
        plane.attempts += 1
        delay = policy.delay_s(plane.attempts)
        plane.restart_due = now + delay
        self.report(f"{exited}; restarting it in {delay:.1f} s (restart {plane.attempts} in a row)")
        return True

    def _relaunch(self, plane: Plane) -> None:
        """Start ``plane`` again with the same command line and environment."""
        plane.restart_due = None
        if plane.ready_file is not None:
            plane.ready_file.unlink(missing_ok=True)
        plane.process = _spawn(plane.argv, plane.env)
        plane.launched_at = time.monotonic()
        plane.reported = False

    def stop_all(self) -> None:
        """SIGTERM kind by kind (:data:`STOP_ORDER`); SIGKILL whatever outlives the grace."""
        for kind in STOP_ORDER:
            group = [p for p in reversed(self.planes) if p.kind == kind and p.alive()]
            for plane in group:
                plane.process.send_signal(signal.SIGTERM)
                # A stopped process acts on SIGTERM only once it runs again.
                plane.process.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + STOP_GRACE_S
            for plane in group:
                try:
                    plane.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    print(f"llmmesh up: {plane.name} did not stop in time; killing it", file=sys.stderr)
                    plane.process.kill()
                    plane.process.wait()


def _spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv), env={**os.environ, **env}, start_new_session=True, preexec_fn=_die_with_parent
    )
