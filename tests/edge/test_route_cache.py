"""RouteCache: TTL, invalidation, capacity and one fetch per key; no network."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llmmesh.edge.route_cache import RouteCache
from llmmesh.edge.settings import EdgeSettings
from llmmesh.v1 import geo_routing_service_pb2 as gpb


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def route(*regions: str) -> list[gpb.RegionStatus]:
    return [gpb.RegionStatus(report=gpb.RegionReport(region=r, zone="eu")) for r in regions]


def names(statuses: Sequence[gpb.RegionStatus] | None) -> list[str] | None:
    return None if statuses is None else [s.report.region for s in statuses]


class Fetcher:
    """Answers ``Route`` from a list it can change, counting calls; waits for
    ``gate`` when one is set."""

    def __init__(self, *regions: str) -> None:
        self.regions = list(regions)
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None

    async def __call__(self) -> list[gpb.RegionStatus]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return route(*self.regions)


def test_a_route_is_kept_for_its_ttl() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, clock=clock)
    assert cache.get("t1", "m") is None
    cache.put("t1", "m", route("eu-west", "eu-central"))
    clock.now = 0.999
    assert names(cache.get("t1", "m")) == ["eu-west", "eu-central"]
    assert cache.get("t1", "other-model") is None and cache.get("t2", "m") is None
    clock.now = 1.0
    assert cache.get("t1", "m") is None
    assert len(cache) == 0


def test_invalidation_by_key_tenant_region_and_all() -> None:
    cache = RouteCache(clock=Clock())
    cache.put("t1", "a", route("eu-west", "eu-central"))
    cache.put("t1", "b", route("eu-central"))
    cache.put("t2", "a", route("us-east"))
    cache.put("t3", "a", route("eu-west"))
    cache.invalidate("t1", "b")
    assert cache.get("t1", "b") is None and cache.get("t1", "a") is not None
    cache.invalidate_region("eu-west")
    assert cache.get("t1", "a") is None and cache.get("t3", "a") is None
    assert names(cache.get("t2", "a")) == ["us-east"]
    cache.put("t1", "a", route("eu-central"))
    cache.invalidate_tenant("t2")
    assert cache.get("t2", "a") is None and cache.get("t1", "a") is not None
    cache.clear()
    assert len(cache) == 0


def test_the_least_recently_used_route_goes_first() -> None:
    cache = RouteCache(capacity=2, clock=Clock())
    cache.put("t1", "m", route("a"))
    cache.put("t2", "m", route("b"))
    assert cache.get("t1", "m") is not None  # t1 is now the most recent
    cache.put("t3", "m", route("c"))
    assert cache.get("t2", "m") is None
    assert names(cache.get("t1", "m")) == ["a"] and names(cache.get("t3", "m")) == ["c"]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        RouteCache(ttl_s=-1)
    with pytest.raises(ValueError, match="capacity"):
        RouteCache(capacity=0)
    with pytest.raises(ValueError, match="stale_s"):
        RouteCache(ttl_s=2.0, stale_s=1.0)
    with pytest.raises(ValueError, match="route_stale_ms"):
        EdgeSettings(route_cache_ms=5_000, route_stale_ms=1_000)


@pytest.mark.asyncio
async def test_concurrent_misses_share_one_fetch_and_hits_need_none() -> None:
    cache = RouteCache(clock=Clock())
    fetch = Fetcher("eu-west")
    fetch.gate = asyncio.Event()
    waiting = [asyncio.create_task(cache.route("t1", "m", fetch)) for _ in range(5)]
    await asyncio.sleep(0)
    fetch.gate.set()
    assert [names(r) for r in await asyncio.gather(*waiting)] == [["eu-west"]] * 5
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    assert (fetch.calls, cache.misses, cache.hits) == (1, 5, 1)


@pytest.mark.asyncio
async def test_an_expired_route_is_fetched_again() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    fetch.regions = ["eu-central"]
    clock.now = 2.0
    assert names(await cache.route("t1", "m", fetch)) == ["eu-central"]
    assert fetch.calls == 2


@pytest.mark.asyncio
async def test_errors_reach_every_waiter_and_are_not_kept() -> None:
    cache = RouteCache(clock=Clock())
    fetch = Fetcher("eu-west")
    fetch.error = LookupError("no region in zone")
    fetch.gate = asyncio.Event()
    waiting = [asyncio.create_task(cache.route("t1", "m", fetch)) for _ in range(3)]
    await asyncio.sleep(0)
    fetch.gate.set()
    outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(o, LookupError) for o in outcomes) and fetch.calls == 1
    fetch.error = None
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    assert fetch.calls == 2


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_the_fetch_to_the_others() -> None:
    cache = RouteCache(clock=Clock())
    fetch = Fetcher("eu-west")
    fetch.gate = asyncio.Event()
    first = asyncio.create_task(cache.route("t1", "m", fetch))
    second = asyncio.create_task(cache.route("t1", "m", fetch))
    await asyncio.sleep(0)
    first.cancel()
    fetch.gate.set()
    assert names(await second) == ["eu-west"]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert fetch.calls == 1 and cache.get("t1", "m") is not None


@pytest.mark.asyncio
async def test_a_fetch_overtaken_by_an_invalidation_is_answered_but_not_kept() -> None:
    cache = RouteCache(clock=Clock())
    fetch = Fetcher("eu-west")
    fetch.gate = asyncio.Event()
    waiting = asyncio.create_task(cache.route("t1", "m", fetch))
    await asyncio.sleep(0)
    cache.invalidate_region("eu-west")  # say eu-west just failed a turn
    fetch.gate.set()
    assert names(await waiting) == ["eu-west"]
    assert cache.get("t1", "m") is None


@pytest.mark.asyncio
async def test_a_route_past_half_its_ttl_is_used_and_refreshed_in_the_background() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    fetch.regions = ["eu-central"]
    fetch.gate = asyncio.Event()
    clock.now = 0.4
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    assert fetch.calls == 1  # young enough: no refresh
    clock.now = 0.6
    # Answered at once, from what it had, while the refresh waits at its gate.
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    await asyncio.sleep(0)
    assert (fetch.calls, cache.refreshes) == (2, 1)  # one refresh, however many hits
    fetch.gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    clock.now = 1.2  # the first answer would have expired; the refreshed one has not
    assert names(await cache.route("t1", "m", fetch)) == ["eu-central"]
    assert (fetch.calls, cache.misses) == (2, 1)


@pytest.mark.asyncio
async def test_a_failed_refresh_keeps_the_route_until_it_expires() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    fetch.error = LookupError("geo-routing is busy")
    clock.now = 0.7
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    await asyncio.sleep(0)
    assert names(cache.get("t1", "m")) == ["eu-west"]
    clock.now = 1.0
    with pytest.raises(LookupError):
        await cache.route("t1", "m", fetch)


@pytest.mark.asyncio
async def test_closing_cancels_a_refresh_still_running() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    fetch.gate = asyncio.Event()
    clock.now = 0.8
    await cache.route("t1", "m", fetch)
    await asyncio.sleep(0)
    assert fetch.calls == 2
    await cache.close()
    fetch.gate.set()
    await asyncio.sleep(0)
    clock.now = 1.1  # the cancelled refresh stored nothing
    assert cache.get("t1", "m") is None


@pytest.mark.asyncio
async def test_a_route_past_its_ttl_is_used_while_refreshed_until_it_is_too_old() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, stale_s=30.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    fetch.regions = ["eu-central"]
    fetch.gate = asyncio.Event()
    clock.now = 13.0  # back after an idle spell: answered at once, refreshed behind
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    assert names(await cache.route("t1", "m", fetch)) == ["eu-west"]
    await asyncio.sleep(0)
    assert (fetch.calls, cache.stale_hits, cache.misses) == (2, 2, 1)  # one refresh for both
    assert cache.get("t1", "m") is None  # past the TTL: not a fresh route
    fetch.gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert names(cache.get("t1", "m")) == ["eu-central"]
    # Too old to be used: the turn waits for geo-routing.
    fetch.regions = ["eu-north"]
    clock.now = 50.0
    assert names(await cache.route("t1", "m", fetch)) == ["eu-north"]
    assert (fetch.calls, cache.misses) == (3, 2)


@pytest.mark.asyncio
async def test_a_stale_route_through_a_failed_region_is_not_used() -> None:
    clock = Clock()
    cache = RouteCache(ttl_s=1.0, stale_s=30.0, clock=clock)
    fetch = Fetcher("eu-west")
    await cache.route("t1", "m", fetch)
    clock.now = 5.0
    cache.invalidate_region("eu-west")
    fetch.regions = ["eu-central"]
    assert names(await cache.route("t1", "m", fetch)) == ["eu-central"]
    assert cache.stale_hits == 0
