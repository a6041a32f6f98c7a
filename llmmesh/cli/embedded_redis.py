"""The Redis ``llmmesh up`` runs with (:func:`choose_redis`) and the
``redis-server`` child it starts for it: on a port chosen before it starts
(Redis cannot report a port it picked), with no persistence: what it holds
(rate-limit windows, the KV prefix index, stream logs) is shared fast state,
rebuilt after a restart.

Every region of a zone counts a key's RPM and TPM in one Redis, so the
limits hold per key across the zone. Without Redis each region counts on
its own, and a key that calls N regions directly gets N times its limits:
that is why the mesh runs a Redis of its own unless told otherwise.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmmesh.cli.supervisor import MeshStartError, Plane, Probe, Supervisor
from llmmesh.topology.mesh_config import MeshConfig

PROBE_TIMEOUT_S = 0.5

REDIS_MODES = ("auto", "embedded", "none")
"""``--redis``: auto (the config's ``redis_url``, else an embedded
``redis-server`` when one is on the PATH, else none), embedded, none."""

PER_REGION = (
    "rate limits (RPM, TPM) are counted by each region on its own, not per key across the mesh: "
    "a key that calls N regions of its zone directly gets N times its limits"
)


@dataclass(frozen=True)
class RedisChoice:
    """Which Redis the mesh's regions and edge share."""

    embedded: bool
    """Run a ``redis-server`` of the mesh's own."""
    warning: str = ""
    """Why rate limits are not exact, for the operator; empty when they are."""


def choose_redis(
    mode: str, config: MeshConfig, which: Callable[[str], str | None] = shutil.which
) -> tuple[MeshConfig, RedisChoice]:
    """``config`` with the ``redis_url`` the planes get (empty for the
    embedded one, or for none) and the choice ``--redis mode`` makes."""
    if mode not in REDIS_MODES:
        raise ValueError(f"--redis must be one of {', '.join(REDIS_MODES)}, got {mode!r}")
    if mode == "auto" and config.redis_url:
        return config, RedisChoice(embedded=False)
    without = config.with_overrides(redis_url="")
    if mode == "embedded" or (mode == "auto" and which("redis-server")):
        return without, RedisChoice(embedded=True)
    if mode == "none":
        ignored = " (mesh.redis_url is ignored)" if config.redis_url else ""
        return without, RedisChoice(False, f"--redis none{ignored}: {PER_REGION}")
    return without, RedisChoice(
        False,
        f"redis-server is not on the PATH, so the mesh runs without Redis: {PER_REGION}. "
        "Install redis-server, or set mesh.redis_url in a --config, for limits per key",
    )


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


def start_embedded_redis(
    sup: Supervisor, host: str, data_dir: Path, *, private_network: bool = False
) -> tuple[Plane, str]:
    """Start ``redis-server`` under ``sup`` and wait for it; the plane and its URL.

    ``private_network``: ``host`` is on a bridge only this machine's network
    namespaces reach (``llmmesh up --netns``), so Redis answers them; else
    Redis's protected mode answers only local clients."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise MeshStartError("--redis embedded needs redis-server on the PATH")
    port = free_port(host)
    argv = [binary, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(data_dir), "--loglevel", "warning"]
    if private_network:
        # Protected mode would answer DENIED to every other namespace.
        argv += ["--protected-mode", "no"]
    plane = sup.launch_program("redis", "redis", argv, redis_probe(host, port))
    sup.wait_ready([plane])
    return plane, f"redis://{host}:{port}/0"
