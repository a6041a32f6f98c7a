"""The Redis of each zone ``llmmesh up`` runs with (:func:`choose_redis`)
and the ``redis-server`` child it starts for a zone that names none: on a
port chosen before it starts
(Redis cannot report a port it picked), with no persistence: what it holds
(rate-limit windows, the KV prefix index, stream logs) is shared fast state,
rebuilt after a restart.

A zone's Redis holds its tenants' content (stream logs carry reply text),
so each zone has its own, like its store. Every region of a zone counts a
key's RPM and TPM in that Redis, so the limits hold per key across the
zone. Without Redis each region counts on its own, and a key that calls N
regions directly gets N times its limits: that is why the mesh runs a
Redis per zone of its own unless told otherwise.
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
"""``--redis``: auto (each zone's configured Redis, else an embedded
``redis-server`` when one is on the PATH, else none), embedded, none."""

PER_REGION = (
    "rate limits (RPM, TPM) are counted by each region on its own, not per key across the mesh: "
    "a key that calls N regions of its zone directly gets N times its limits"
)


@dataclass(frozen=True)
class RedisChoice:
    """Which zones get a Redis of the mesh's own."""

    embedded_zones: tuple[str, ...] = ()
    """Zones that get a ``redis-server`` of the mesh's own, one each."""
    warning: str = ""
    """Why rate limits are not exact, for the operator; empty when they are."""

    @property
    def embedded(self) -> bool:
        """Whether the mesh runs any ``redis-server`` of its own."""
        return bool(self.embedded_zones)


def choose_redis(
    mode: str, config: MeshConfig, which: Callable[[str], str | None] = shutil.which
) -> tuple[MeshConfig, RedisChoice]:
    """``config`` with each zone's ``redis_url`` as the planes get it (empty
    for an embedded one, or for none) and the choice ``--redis mode`` makes."""
    if mode not in REDIS_MODES:
        raise ValueError(f"--redis must be one of {', '.join(REDIS_MODES)}, got {mode!r}")
    configured = {z.name: config.redis_url_of(z) for z in config.zones if config.redis_url_of(z)}
    kept = configured if mode == "auto" else {}
    updated = config.with_zone_redis(kept)
    lacking = tuple(z.name for z in config.zones if z.name not in kept)
    if mode == "embedded" or (mode == "auto" and lacking and which("redis-server")):
        return updated, RedisChoice(lacking)
    if mode == "none":
        ignored = " (the configured Redis is ignored)" if configured else ""
        return updated, RedisChoice((), f"--redis none{ignored}: {PER_REGION}")
    if not lacking:
        return updated, RedisChoice()
    return updated, RedisChoice(
        (),
        f"redis-server is not on the PATH, so zone {', '.join(lacking)} runs without Redis: {PER_REGION}. "
        "Install redis-server, or set zones.NAME.redis_url in a --config, for limits per key",
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
    sup: Supervisor, host: str, data_dir: Path, *, name: str = "redis", private_network: bool = False
) -> tuple[Plane, str]:
    """Start ``redis-server`` under ``sup`` as plane ``name`` and wait for
    it; the plane and its URL.

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
    plane = sup.launch_program(name, "redis", argv, redis_probe(host, port))
    sup.wait_ready([plane])
    return plane, f"redis://{host}:{port}/0"
