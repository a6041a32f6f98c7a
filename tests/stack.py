"""The one builder of in-process test meshes, and the smallest mesh.

:class:`MeshBuilder` starts planes (the global plane, engine pods, regions,
the edge) as real gRPC (or HTTP) servers on port 0 in this event loop, with
the test settings every suite shares (fast heartbeats and refreshes,
in-memory stores, plaintext unless told otherwise), and stops them, last
started first, when its block ends. :func:`running_stack` is its smallest
mesh: the global plane, engine pods, one region and optionally the edge;
:mod:`tests.multiregion` builds zones of regions with it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from llmmesh.edge.server import EdgeServer, start_edge
from llmmesh.edge.settings import EdgeSettings
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.globalplane.server import GlobalPlane, start_global_plane
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.region.server import RegionPlane, start_region
from llmmesh.region.settings import RegionSettings

DEV_KEY = "sk-llmmesh-test"
ROUTABLE_WAIT_S = 10.0


@dataclass
class Stack:
    """The running planes."""

    global_plane: GlobalPlane
    engine: EnginePod
    region: RegionPlane
    edge: EdgeServer | None
    engines: tuple[EnginePod, ...] = ()


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)
    assert predicate(), what


class MeshBuilder:
    """Starts planes with test settings and stops them, last started first,
    when its ``async with`` block ends (or fails part way)."""

    def __init__(self) -> None:
        # What was started, with how to stop it, in the order it started.
        self._stops: list[tuple[object, Callable[[], Awaitable[None]]]] = []

    async def __aenter__(self) -> MeshBuilder:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        while self._stops:
            await self._stops.pop()[1]()

    def on_exit(self, started: object, stop: Callable[[], Awaitable[None]]) -> None:
        """Run ``stop`` for ``started`` when the block ends, before what was started earlier stops."""
        self._stops.append((started, stop))

    async def stop(self, started: object) -> None:
        """Stop ``started`` now (a test that takes a plane down); the block's end skips it."""
        (entry,) = [entry for entry in self._stops if entry[0] is started]
        self._stops.remove(entry)
        await entry[1]()

    async def global_plane(self, **overrides: object) -> GlobalPlane:
        values: dict[str, object] = {
            "dev_key": DEV_KEY,
            "heartbeat_interval_ms": 200,
            "database_url": "sqlite://",
            "insecure": True,
            **overrides,
        }
        glob = await start_global_plane(GlobalSettings(**values))  # type: ignore[arg-type]
        self.on_exit(glob, lambda: glob.stop(0.5))
        return glob

    async def pod(self, pod_id: str, **overrides: object) -> EnginePod:
        values: dict[str, object] = {"pod_id": pod_id, "insecure": True, **overrides}
        pod = await start_engine(EngineSettings(**values))  # type: ignore[arg-type]
        self.on_exit(pod, lambda: pod.stop(0.5))
        return pod

    async def pods(self, region: str, count: int, **overrides: object) -> list[EnginePod]:
        """``count`` pods named ``{region}-pod-{n}``."""
        return [await self.pod(f"{region}-pod-{n}", **overrides) for n in range(count)]

    async def region(self, settings: RegionSettings) -> RegionPlane:
        """A started region, once geo-routing knows it and every pod has said
        what it embeds: on a loaded machine its first heartbeat or a pod's
        first answer can miss its deadline, and until one arrives the zone
        has no region to route to, or an embedding model is not yet known
        (at most ROUTABLE_WAIT_S, for a test whose global plane refuses the
        region, or whose pod is down, on purpose)."""
        plane = await start_region(settings)
        self.on_exit(plane, lambda: plane.stop(0.5))
        deadline = time.monotonic() + ROUTABLE_WAIT_S
        while not plane.heartbeat.delivered or plane.embedding_pods.unanswered:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return plane

    async def edge(self, global_address: str, **overrides: object) -> EdgeServer:
        values: dict[str, object] = {
            "port": 0,
            "global_address": global_address,
            "auth_cache_ms": 0,
            "insecure": True,
            **overrides,
        }
        server = await start_edge(EdgeSettings(**values))  # type: ignore[arg-type]
        self.on_exit(server, server.stop)
        return server


@asynccontextmanager
async def running_stack(
    with_edge: bool = False,
    database_url: str = "sqlite://",
    *,
    pods: int = 1,
    region_overrides: Mapping[str, object] | None = None,
    global_overrides: Mapping[str, object] | None = None,
    **engine_overrides: object,
) -> AsyncIterator[Stack]:
    """Start every plane in this process (``pods`` engine pods behind the
    region); stop them all afterwards."""
    async with MeshBuilder() as build:
        glob = await build.global_plane(database_url=database_url, **(global_overrides or {}))
        engines = await build.pods("us-east", pods, **engine_overrides)
        region = await build.region(region_settings(glob.address, engines, **(region_overrides or {})))
        edge = await build.edge(glob.address) if with_edge else None
        yield Stack(glob, engines[0], region, edge, tuple(engines))


SHARED_STACK_GLOBAL: Mapping[str, object] = {"missed_heartbeats_until_down": 25}
"""For a stack many tests share and none takes down: its region stays
routable through 5 s without a heartbeat (25 of 200 ms), however long a
busy test process keeps the heartbeat from being sent."""


def region_settings(global_address: str, engines: Sequence[EnginePod], **overrides: object) -> RegionSettings:
    """Test settings of a region over ``engines``: fast refreshes, in-memory store."""
    values: dict[str, object] = {
        "global_address": global_address,
        "engine_addresses": ",".join(pod.address for pod in engines),
        "heartbeat_interval_ms": 200,
        "policy_refresh_ms": 200,
        "engine_health_interval_ms": 100,
        "zone_store_url": "sqlite://",
        "insecure": True,
        **overrides,
    }
    return RegionSettings(**values)  # type: ignore[arg-type]
