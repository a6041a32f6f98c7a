"""``llmmesh up --redis embedded``: a ``redis-server`` child of the mesh, on
a port chosen before it starts (Redis cannot report a port it picked), with
no persistence: what it holds (rate-limit windows, the KV prefix index,
stream logs) is shared fast state, rebuilt after a restart.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from llmmesh.cli.supervisor import MeshStartError, Plane, Probe, Supervisor

PROBE_TIMEOUT_S = 0.5


def free_port(host: str) -> int:
    """A port nothing listens on now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def redis_probe(host: str, port: int) -> Probe:
    """Whether the Redis at ``host:port`` answers PING; its address once it does."""

    def probe() -> dict[str, object] | None:
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
                sock.sendall(b"PING\r\n")
                answer = sock.recv(64)
        except OSError:
            return None
        return {"address": f"{host}:{port}"} if answer.startswith(b"+PONG") else None

    return probe


def start_embedded_redis(sup: Supervisor, host: str, data_dir: Path) -> tuple[Plane, str]:
    """Start ``redis-server`` under ``sup`` and wait for it; the plane and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise MeshStartError("--redis embedded needs redis-server on the PATH")
    port = free_port(host)
    argv = [binary, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(data_dir), "--loglevel", "warning"]
    plane = sup.launch_program("redis", "redis", argv, redis_probe(host, port))
    sup.wait_ready([plane])
    return plane, f"redis://{host}:{port}/0"
