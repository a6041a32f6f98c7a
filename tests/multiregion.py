"""An in-process multi-region mesh for failover tests: the global plane,
regions in their zones (each with its own simulator pods), one zone store
per zone that all of the zone's regions share, and an edge; every server is
real, on port 0 of the loopback, in this event loop.

A region can be killed (its gRPC server stopped at once, in-flight streams
cut, and its heartbeats stopped, as a dead process would) and started
again, over the same pods and zone store, on a new address it reports to
geo-routing (as a rescheduled region comes back).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from llmmesh.edge.server import EdgeServer
from llmmesh.engine.server import EnginePod
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.region.server import RegionPlane
from llmmesh.region.settings import RegionSettings
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import common_pb2
from tests.stack import MeshBuilder, region_settings, wait_until

LOCATIONS = {
    "us-east": "39.0,-77.5",
    "us-west": "45.6,-121.2",
    "eu-west": "53.3,-6.3",
    "eu-central": "50.1,8.7",
}


@dataclass(frozen=True)
class RegionSpec:
    """One region to start: its name and zone, its pods and their settings."""

    name: str
    zone: str
    pods: int = 1
    engine: Mapping[str, object] = field(default_factory=dict)
    settings: Mapping[str, object] = field(default_factory=dict)


@dataclass
class RunningRegion:
    """A region of the mesh, up or killed."""

    spec: RegionSpec
    settings: RegionSettings
    plane: RegionPlane
    pods: tuple[EnginePod, ...]
    # Starts the region again, and stops every plane it started at the end.
    builder: MeshBuilder
    up: bool = True
    # Planes killed and replaced (the builder stops them at the end).
    dead: list[RegionPlane] = field(default_factory=list)


@dataclass
class MultiRegionMesh:
    """The running planes, by region name."""

    global_plane: GlobalPlane
    regions: dict[str, RunningRegion]
    edge: EdgeServer
    store_urls: dict[str, str]

    @property
    def url(self) -> str:
        return self.edge.url

    def plane(self, region: str) -> RegionPlane:
        return self.regions[region].plane

    def zone_regions(self, zone: str) -> list[RunningRegion]:
        return [r for r in self.regions.values() if r.spec.zone == zone]

    def store(self, zone: str) -> ZoneStore:
        """The zone's store, as its first region opened it."""
        return self.zone_regions(zone)[0].plane.store

    async def new_key(self, zone: str) -> tuple[str, str]:
        """A new tenant of ``zone`` and a key of it: (tenant id, secret); every
        region of the zone knows the key when this returns."""
        book = self.global_plane.tenants
        tenant = await book.create_tenant(f"t-{uuid.uuid4().hex[:10]}", zone, TenantTier.PRO)
        _, secret = await book.create_api_key(tenant.id)
        for region in self.zone_regions(zone):
            if region.up:
                assert await region.plane.policy.refresh()
        return tenant.id, secret

    def routable(self, region: str) -> bool:
        """Whether geo-routing counts the region as serving."""
        status = self.global_plane.directory.status(region)
        return status is not None and status.effective_health.name in ("SERVING", "DEGRADED")

    async def kill(self, region: str) -> None:
        """Stop the region at once: open streams are cut, new calls refused,
        and it no longer reports to geo-routing."""
        running = self.regions[region]
        running.up = False
        await running.plane.server.stop(0)
        await running.plane.heartbeat.close()

    async def wait_routed_out(self, region: str) -> None:
        await wait_until(lambda: not self.routable(region), 10.0, f"{region} routed out")

    async def restart(self, region: str) -> None:
        """Start a killed region again over the same pods and zone store;
        returns once geo-routing routes to it."""
        running = self.regions[region]
        assert not running.up, f"{region} is up"
        running.dead.append(running.plane)
        running.plane = await running.builder.region(running.settings)
        running.up = True
        await wait_until(lambda: self.routable(region), 10.0, f"{region} routed again")


def _store_url(zone: str, store_dir: Path | None, store_urls: Mapping[str, str]) -> str:
    if zone in store_urls:
        return store_urls[zone]
    assert store_dir is not None, f"no store for zone {zone}"
    return f"sqlite:///{store_dir / f'zone-{zone}.db'}"


@asynccontextmanager
async def running_multiregion(
    specs: Sequence[RegionSpec],
    *,
    store_dir: Path | None = None,
    store_urls: Mapping[str, str] | None = None,
    edge: Mapping[str, object] | None = None,
) -> AsyncIterator[MultiRegionMesh]:
    """Start the global plane (dev tenant in zone ``us``), every region of
    ``specs`` with its pods, and an edge; stop them all afterwards. A zone's
    store is ``store_urls[zone]``, else an SQLite file in ``store_dir``."""
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        regions: dict[str, RunningRegion] = {}
        urls = {spec.zone: _store_url(spec.zone, store_dir, store_urls or {}) for spec in specs}
        for spec in specs:
            pods = tuple(await build.pods(spec.name, spec.pods, **spec.engine))
            settings = region_settings(
                glob.address,
                pods,
                region=spec.name,
                zone=spec.zone,
                location=LOCATIONS.get(spec.name, "0.0,0.0"),
                zone_store_url=urls[spec.zone],
                **spec.settings,
            )
            regions[spec.name] = RunningRegion(spec, settings, await build.region(settings), pods, build)
        server = await build.edge(glob.address, **(edge or {}))
        mesh = MultiRegionMesh(glob, regions, server, urls)
        await wait_until(lambda: all(mesh.routable(name) for name in regions), 10.0, "every region routed")
        yield mesh


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)
