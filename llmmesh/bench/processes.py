"""Systems under test as child processes: started in their own session with
output to a log file, awaited until they serve, and stopped with their
whole process group (vLLM's engine core and workers are grandchildren).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

STOP_GRACE_S = 30.0
_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


class StartupError(Exception):
    """A system did not come up; the message names its log file."""

    def __init__(self, name: str, reason: str, log_path: Path) -> None:
        super().__init__(f"{name} did not start: {reason} (log: {log_path})")
        self.name = name
        self.log_path = log_path


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (another process may take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # A system outliving a SIGKILLed benchmark would hold two cores and
    # gigabytes of KV cache, skewing whatever runs next.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _live_group_members(pgid: int) -> int:
    """Processes in group ``pgid`` that are not zombies (Linux ``/proc``)."""
    alive = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After "pid (comm)": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            alive += 1
    return alive


def _read_json(path: Path) -> object | None:
    """The JSON in ``path``, or None while it does not exist (ready files
    are written atomically, so one that exists is complete)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    payload: object = json.loads(text)
    return payload


@dataclass
class ChildProcess:
    """A started system: its process (leader of its own process group),
    name and log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @classmethod
    def start(
        cls, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> ChildProcess:
        """Start ``argv`` in a new session, stdout and stderr to ``log_path``."""
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return cls(name, process, log_path)

    def alive(self) -> bool:
        return self.process.poll() is None

    def uptime_s(self) -> float:
        """Seconds since the process was started."""
        return time.monotonic() - self.started_at

    def _check_alive(self) -> None:
        if not self.alive():
            raise StartupError(self.name, f"exited with status {self.process.returncode}", self.log_path)

    async def wait_ready_file(self, path: Path, timeout_s: float) -> dict[str, object]:
        """Wait until the process writes its JSON ready file; return it.
        Raises StartupError when the process exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while (payload := _read_json(path)) is None:
            self._check_alive()
            if time.monotonic() > deadline:
                raise StartupError(self.name, f"no ready file within {timeout_s:.0f} s", self.log_path)
            await asyncio.sleep(_POLL_S)
        if not isinstance(payload, dict):
            raise StartupError(self.name, "the ready file is not a JSON object", self.log_path)
        return {str(key): value for key, value in payload.items()}

    async def wait_http_ok(self, url: str, timeout_s: float) -> None:
        """Wait until ``GET url`` answers 200. Raises StartupError when the
        process exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while True:
                self._check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url)).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise StartupError(
                        self.name, f"{url} not healthy within {timeout_s:.0f} s", self.log_path
                    )
                await asyncio.sleep(_POLL_S)

    def stop(self, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGTERM the process group, wait up to ``grace_s`` for every member
        to exit, then SIGKILL what is left. Returns once the whole group is
        gone (True) or, should a killed member linger, after a few more
        seconds (False). Blocking, so it also runs to the end while the event
        loop is being torn down by Ctrl-C."""
        pgid = self.process.pid  # start_new_session: the leader's pid is the group's id
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.process.poll()  # reap the leader, which would count as a zombie otherwise
                if self.process.returncode is not None and _live_group_members(pgid) == 0:
                    return True
                time.sleep(0.1)
        return False
