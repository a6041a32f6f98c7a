"""Routes the edge remembers for a moment instead of asking geo-routing on every turn.

A route is a tenant's serving regions for a model, best first, as
``GeoRoutingService.Route`` answers. It changes only as often as regions
report in (about a second), and a turn that reaches a region which no longer
serves fails over to the next one anyway, so an answer a second old is as
good as a fresh one. :class:`RouteCache` keeps each (tenant, model) route for
``ttl_s`` and forgets it earlier when told: all routes through a region that
failed (:meth:`RouteCache.invalidate_region`), or a tenant's routes
(:meth:`RouteCache.invalidate_tenant`). Concurrent misses of one key share one
``Route`` call. A turn that finds its route past half its TTL uses it and
asks for a fresh one in the background (:mod:`llmmesh.core.refresh`), so steady
traffic never waits on geo-routing.

A route past its TTL but younger than ``stale_s`` is still used, while a
fresh one is fetched behind it (stale-while-revalidate): a tenant whose
turns come a little less often than the TTL, or that comes back after an
idle spell, would otherwise wait on geo-routing at almost every turn. It is
safe for the same reason a second-old route is: a region that stopped
serving meanwhile refuses or drops the turn, which fails over and forgets
every route through it. Errors are never remembered: a tenant whose zone has
no region now is asked again on its next turn.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from llmmesh.core.refresh import SingleFlight, refresh_due
from llmmesh.v1 import geo_routing_service_pb2

Route = tuple[geo_routing_service_pb2.RegionStatus, ...]
"""A tenant's regions for a model, best first."""
FetchRoute = Callable[[], Awaitable[Sequence[geo_routing_service_pb2.RegionStatus]]]
"""Asks geo-routing for the route of one (tenant, model)."""


@dataclass(frozen=True)
class _Entry:
    route: Route
    fetched_at: float
    regions: frozenset[str]


class RouteCache:
    """Routes by (tenant id, model) for ``ttl_s`` seconds, and used while
    refreshed until ``stale_s`` (``ttl_s`` when not given: never past the
    TTL); at most ``capacity`` of them (the least recently used go first).
    Not thread-safe: one event loop."""

    def __init__(
        self,
        ttl_s: float = 1.0,
        capacity: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        stale_s: float | None = None,
    ) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if stale_s is not None and not stale_s >= ttl_s:
            raise ValueError("stale_s must be at least ttl_s")
        self._ttl_s = ttl_s
        self._stale_s = ttl_s if stale_s is None else stale_s
        self._capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._fetching: SingleFlight[Route] = SingleFlight("edge routes")
        # Bumped by every invalidation: a fetch that began before one may
        # carry what it invalidated, so its answer is returned but not kept.
        self._epoch = 0
        self.hits = 0
        self.misses = 0
        self.refreshes = 0
        self.stale_hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant_id: str, model: str) -> Route | None:
        """The remembered route, or None when there is none younger than ``ttl_s``."""
        key = (tenant_id, model)
        entry = self._entries.get(key)
        if entry is None:
            return None
        age = self._clock() - entry.fetched_at
        if age >= self._ttl_s:
            if age >= self._stale_s:
                del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.route

    def put(self, tenant_id: str, model: str, route: Sequence[geo_routing_service_pb2.RegionStatus]) -> Route:
        """Remember ``route`` for ``ttl_s``; returns it as kept (a tuple)."""
        kept = tuple(route)
        key = (tenant_id, model)
        regions = frozenset(status.report.region for status in kept)
        self._entries[key] = _Entry(kept, self._clock(), regions)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return kept

    async def route(self, tenant_id: str, model: str, fetch: FetchRoute) -> Route:
        """The remembered route, or ``fetch``'s answer, then remembered.

        Concurrent misses of one key await one ``fetch``; its error reaches
        each of them and nothing is remembered. A caller cancelled while
        waiting does not cancel the fetch the others wait for. A hit past
        half the TTL, and a route past the TTL but younger than ``stale_s``,
        start that fetch without waiting for it.
        """
        key = (tenant_id, model)
        cached = self.get(tenant_id, model)
        if cached is not None:
            self.hits += 1
            age = self._clock() - self._entries[key].fetched_at
            if refresh_due(age, self._ttl_s) and key not in self._fetching:
                self.refreshes += 1
                self._start_fetch(key, fetch)
            return cached
        stale = self._entries.get(key)
        if stale is not None and self._clock() - stale.fetched_at < self._stale_s:
            self.stale_hits += 1
            self._entries.move_to_end(key)
            if key not in self._fetching:
                self._start_fetch(key, fetch)
            return stale.route
        self.misses += 1
        return await asyncio.shield(self._start_fetch(key, fetch))

    def _start_fetch(self, key: tuple[str, str], fetch: FetchRoute) -> asyncio.Task[Route]:
        epoch = self._epoch
        return self._fetching.start(key, lambda: self._fetch(key, fetch, epoch))

    async def _fetch(self, key: tuple[str, str], fetch: FetchRoute, epoch: int) -> Route:
        route = tuple(await fetch())
        if epoch == self._epoch:
            self.put(*key, route)
        return route

    async def close(self) -> None:
        """Cancel the fetches still running (a refresh nobody waits for included)."""
        await self._fetching.close()

    def invalidate(self, tenant_id: str, model: str) -> None:
        """Forget one route."""
        self._epoch += 1
        self._entries.pop((tenant_id, model), None)

    def invalidate_tenant(self, tenant_id: str) -> None:
        """Forget every route of ``tenant_id`` (say, after its policy changed)."""
        self._epoch += 1
        for key in [key for key in self._entries if key[0] == tenant_id]:
            del self._entries[key]

    def invalidate_region(self, region: str) -> None:
        """Forget every route through ``region`` (say, after it refused or dropped a turn)."""
        self._epoch += 1
        for key in [key for key, entry in self._entries.items() if region in entry.regions]:
            del self._entries[key]

    def clear(self) -> None:
        """Forget every route."""
        self._epoch += 1
        self._entries.clear()
