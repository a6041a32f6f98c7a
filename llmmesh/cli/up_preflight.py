"""What ``llmmesh up`` checks before it starts anything: that every fixed
port it will bind is free (a taken one is named with the setting that picks
another), and that no other ``llmmesh up`` runs on the same home (its
databases and ``mesh.json`` are that mesh's)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path
from typing import TextIO

from llmmesh.topology.mesh_config import MeshConfig

LOCK_FILE = "up.lock"


class PreflightError(Exception):
    """Why ``llmmesh up`` must not start; its message is the one line it prints."""


def fixed_ports(config: MeshConfig) -> list[tuple[int, str]]:
    """Each port the mesh binds by number (0 picks a free one, never taken),
    with how to pick another."""
    ports = []
    if config.edge_port:
        ports.append((config.edge_port, "the edge's: --edge-port picks another, 0 any free one"))
    if config.global_port:
        ports.append((config.global_port, "the global plane's: global_port in the [mesh] table of --config"))
    for region in config.regions():
        if region.port:
            ports.append((region.port, f"region {region.name}'s: its port in --config"))
    return ports


def check_ports_free(config: MeshConfig) -> None:
    """PreflightError naming the first fixed port on ``config.host`` that
    something else holds."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    for port, whose in fixed_ports(config):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As the planes bind: a port in TIME_WAIT is free for them too.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.host, port))
            except OSError as err:
                taken = "is taken" if err.errno == errno.EADDRINUSE else f"cannot be bound ({err.strerror})"
                raise PreflightError(f"port {port} on {config.host} {taken}: it is {whose}") from None


class HomeLock:
    """An exclusive lock on ``home`` for one ``llmmesh up``, held until
    :meth:`release` (or the process ends: the kernel drops a flock with its
    holder, so a crashed mesh leaves no stale lock). The lock file names the
    holder's pid for the refusal message."""

    def __init__(self, home: Path) -> None:
        self.path = home / LOCK_FILE
        self._file: TextIO | None = None

    def acquire(self) -> None:
        """Take the lock; PreflightError naming the running mesh's pid when another holds it."""
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise PreflightError(
                f"another llmmesh up (pid {holder}) runs on {self.path.parent}: stop it, or give this one "
                "another home with LLMMESH_HOME"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
