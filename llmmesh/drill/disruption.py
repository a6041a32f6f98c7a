"""Disrupting one part of the mesh and restoring it.

For a mesh ``llmmesh up`` runs, the part is a process the mesh started,
named in ``mesh.json``'s ``pids`` (a region, a pod, ``global`` or
``redis``). Before any signal the drill checks that the pid is still a
child of the ``llmmesh up`` process that wrote the file; it never signals
anything else.

- ``kill``: SIGKILL. The restore is the supervisor's: ``llmmesh up``
  restarts the process on the same ports and rewrites ``mesh.json`` with
  the new pid once it serves; the drill waits for that pid.
- ``partition``: SIGSTOP, then SIGCONT after the partition period. The
  process stops answering while its sockets stay open, as in a network
  cut: peers see silence, not a reset. Whatever happens to the drill, a
  stopped process is continued before it exits.

- ``link-down``: the link of the part's host (``llmmesh up --netns``,
  ``mesh.json``'s ``netns`` entry) goes down, then up again after the
  partition period: packets to and from the host are dropped, connections
  stay open, as when a cable is pulled. Whatever happens to the drill, the
  link is brought back up before it exits.
- ``partition`` of kind ``partition-global`` (``llmmesh up --netns``): the
  region's host and the global plane's each get a blackhole route to the
  other's address, then lose it after the partition period: every packet
  between the two is dropped by its sender's routing table, in both
  directions (the region's heartbeats and usage reports, anything the
  global plane sends it), while both still reach every other host (the
  edge, the pods, the drill). Whatever happens to the drill, the routes
  are removed before it exits.

A deployed mesh is disrupted by the operator's commands (``sh -c``):
``--disrupt-command`` (kubectl, iptables…) and ``--restore-command``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from llmmesh.topology.netns import NetHost, NetnsError, set_link

COMMAND_TIMEOUT_S = 120.0


class DisruptionError(Exception):
    """The part cannot be disrupted (or restored); the message says why."""


class Disruption:
    """Disrupts one part once, restores it once."""

    description = ""
    restores_itself = False
    """Whether the restore comes by itself (a supervisor's restart) instead of after the partition period."""

    async def disrupt(self) -> None:
        raise NotImplementedError

    async def restore(self, timeout_s: float) -> float | None:
        """Restore (or wait for the restore, at most ``timeout_s``); when it
        was restored (monotonic), or None when it was not in time."""
        raise NotImplementedError

    async def release(self) -> None:
        """Leave nothing disrupted that the drill can still restore (called on every exit)."""


def mesh_pid(mesh_file: Path, plane: str) -> tuple[int, int]:
    """The pid of ``plane`` in ``mesh_file`` and the pid of the ``llmmesh up`` that wrote it."""
    try:
        data = json.loads(mesh_file.read_text())
        pids = data["pids"]
        return int(pids[plane]), int(data["pid"])
    except KeyError:
        raise DisruptionError(f"{mesh_file} names no process {plane!r}") from None
    except (OSError, ValueError, TypeError) as err:
        raise DisruptionError(f"cannot read {mesh_file}: {err}") from None


def parent_of(pid: int) -> int | None:
    """The parent pid of a live (not zombie) process, from /proc; None when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[1])


class ProcessDisruption(Disruption):
    """Signals one process that ``llmmesh up`` started."""

    def __init__(self, mesh_file: Path, plane: str, mode: str, poll_interval_s: float) -> None:
        self._mesh_file = mesh_file
        self._plane = plane
        self._mode = mode
        self._poll_s = poll_interval_s
        self._pid, self._owner = mesh_pid(mesh_file, plane)
        self._check_ours(self._pid)
        self._stopped = False
        self.restores_itself = mode == "kill"
        self.description = f"{plane} (pid {self._pid})"
        self.new_pid: int | None = None

    def _check_ours(self, pid: int) -> None:
        if parent_of(pid) != self._owner:
            raise DisruptionError(
                f"pid {pid} of {self._plane} is not a running child of llmmesh up (pid {self._owner}): "
                "the drill signals only processes the mesh started"
            )

    async def disrupt(self) -> None:
        self._check_ours(self._pid)
        if self._mode == "kill":
            os.kill(self._pid, signal.SIGKILL)
        else:
            os.kill(self._pid, signal.SIGSTOP)
            self._stopped = True

    async def restore(self, timeout_s: float) -> float | None:
        if self._mode == "partition":
            await self.release()
            return time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                pid, _ = mesh_pid(self._mesh_file, self._plane)
            except DisruptionError:
                pid = self._pid  # mesh.json is being rewritten, or the mesh stopped
            if pid != self._pid and parent_of(pid) == self._owner:
                self.new_pid = pid
                return time.monotonic()
            await asyncio.sleep(self._poll_s)
        return None

    async def release(self) -> None:
        if self._stopped:
            self._stopped = False
            try:
                os.kill(self._pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def mesh_host(mesh_file: Path, plane: str) -> NetHost:
    """The host of ``plane`` (``global``, ``edge`` or a region) in ``mesh_file``'s ``netns`` entry."""
    try:
        data = json.loads(mesh_file.read_text())
    except (OSError, ValueError) as err:
        raise DisruptionError(f"cannot read {mesh_file}: {err}") from None
    netns = data.get("netns") if isinstance(data, dict) else None
    if not isinstance(netns, dict):
        raise DisruptionError(
            "this mesh runs on one host: cutting a host's network needs a mesh of `llmmesh up --netns`"
        )
    try:
        host = netns["hosts"][plane]
        return NetHost(plane, str(host["netns"]), str(host["address"]), str(host["link"]))
    except (KeyError, TypeError):
        raise DisruptionError(f"{mesh_file} names no host of {plane!r}") from None


class LinkDisruption(Disruption):
    """Takes the link of one host of the mesh down, then up again."""

    def __init__(self, mesh_file: Path, plane: str) -> None:
        self.host = mesh_host(mesh_file, plane)
        self._down = False
        self.description = f"{plane} (host {self.host.address}, link {self.host.link})"

    async def disrupt(self) -> None:
        await self._set(up=False)

    async def restore(self, timeout_s: float) -> float | None:
        await self.release()
        return time.monotonic()

    async def release(self) -> None:
        if self._down:
            await self._set(up=True)

    async def _set(self, *, up: bool) -> None:
        try:
            await asyncio.to_thread(set_link, self.host.link, up=up)
        except NetnsError as err:
            raise DisruptionError(str(err)) from None
        self._down = not up


class RouteDisruption(Disruption):
    """Cuts two hosts of the mesh off from each other alone (see the module docstring)."""

    def __init__(self, mesh_file: Path, plane: str, peer: str) -> None:
        self.hosts = (mesh_host(mesh_file, plane), mesh_host(mesh_file, peer))
        self._routes: list[tuple[NetHost, str]] = []
        here, there = self.hosts
        self.description = (
            f"{plane} from {peer} (hosts {here.address} and {there.address} "
            "drop every packet between them; every other path stays)"
        )

    async def disrupt(self) -> None:
        here, there = self.hosts
        for host, address in ((here, there.address), (there, here.address)):
            await _blackhole(host, address, present=True)
            self._routes.append((host, address))

    async def restore(self, timeout_s: float) -> float | None:
        await self.release()
        return time.monotonic()

    async def release(self) -> None:
        while self._routes:
            host, address = self._routes.pop()
            await _blackhole(host, address, present=False)


async def _blackhole(host: NetHost, address: str, *, present: bool) -> None:
    """Add (``present``) or remove the blackhole route to ``address`` in ``host``'s namespace."""
    command = ["ip", "-n", host.netns, "route", "add" if present else "del", "blackhole", f"{address}/32"]
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
    except OSError as err:
        raise DisruptionError(f"`{' '.join(command)}` failed: {err}") from None
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            _, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DisruptionError(
            f"`{' '.join(command)}` did not finish within {COMMAND_TIMEOUT_S:.0f} s"
        ) from None
    if process.returncode != 0:
        raise DisruptionError(
            f"`{' '.join(command)}` exited with status {process.returncode}: {stderr.decode().strip()}"
        )


class CommandDisruption(Disruption):
    """Runs the operator's commands: one disrupts, the other (optional) restores."""

    def __init__(self, disrupt_command: str, restore_command: str) -> None:
        self._disrupt = disrupt_command
        self._restore = restore_command
        self._restored = True
        self.description = f"`{disrupt_command}`"

    async def disrupt(self) -> None:
        self._restored = not self._restore
        await _run(self._disrupt)

    async def restore(self, timeout_s: float) -> float | None:
        await self.release()
        return time.monotonic()

    async def release(self) -> None:
        if not self._restored:
            self._restored = True
            await _run(self._restore)


async def _run(command: str) -> None:
    process = await asyncio.create_subprocess_shell(command)
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            status = await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DisruptionError(f"`{command}` did not finish within {COMMAND_TIMEOUT_S:.0f} s") from None
    if status != 0:
        raise DisruptionError(f"`{command}` exited with status {status}")
