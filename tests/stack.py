"""An in-process mesh for servicer-level tests: the global plane, one engine
pod, one region and optionally the edge, each a real gRPC (or HTTP) server on
port 0 in this event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
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


@asynccontextmanager
async def running_stack(
    with_edge: bool = False,
    database_url: str = "sqlite://",
    *,
    pods: int = 1,
    region_overrides: Mapping[str, object] | None = None,
    **engine_overrides: object,
) -> AsyncIterator[Stack]:
    """Start every plane in this process (``pods`` engine pods behind the
    region); stop them all afterwards."""
    glob = await start_global_plane(
        GlobalSettings(dev_key=DEV_KEY, heartbeat_interval_ms=200, database_url=database_url, insecure=True)
    )
    engines = [
        await start_engine(EngineSettings(pod_id=f"us-east-pod-{n}", insecure=True, **engine_overrides))  # type: ignore[arg-type]
        for n in range(pods)
    ]
    engine = engines[0]
    region = await start_region(region_settings(glob.address, engines, **(region_overrides or {})))
    edge = (
        await start_edge(EdgeSettings(port=0, global_address=glob.address, auth_cache_ms=0, insecure=True))
        if with_edge
        else None
    )
    try:
        yield Stack(glob, engine, region, edge, tuple(engines))
    finally:
        if edge is not None:
            await edge.stop()
        await region.stop(0.5)
        for pod in engines:
            await pod.stop(0.5)
        await glob.stop(0.5)


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
