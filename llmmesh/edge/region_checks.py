"""The edge's own checks of its regions, trusted over a stale DOWN from geo-routing.

Geo-routing leaves a region out of its routes once the region misses its
heartbeats, and it cannot tell a dead region from one cut off from the
global plane alone that still serves every edge it reaches. So when a route
leaves out a region that the edge's previous answer to the same question
listed, the edge checks the region itself before dropping it. The region is
kept when

- no turn failed on it at this edge within ``failure_memory_s`` (the edge's
  own evidence that it does not serve, whatever a check says), and
- it answers ``GetRegionInfo`` on the edge's channel to it, as the region
  the route named, in its zone, serving the route's model (when it names
  one), with a healthy engine pod and a health of SERVING or DEGRADED: what
  it would say in a heartbeat, heard fresh.

A region that reports itself down says so to the check as well, and a
draining one refuses it, so only the staleness of geo-routing's view is
overridden, never the region's own word. A kept region comes only from an
earlier answer to the same question (the tenant's zone, the model), so
residency holds; it stays while every later check passes, and goes with
the first that does not. A region's answer is reused for ``check_ttl_s``;
concurrent checks of one region share one call.

Geo-routing's load figures for a kept region are stale, so the edge places
it by its own: before the first listed region that runs more of this edge's
turns than it does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from llmmesh.core.refresh import SingleFlight
from llmmesh.v1 import chat_service_pb2, common_pb2, geo_routing_service_pb2

log = logging.getLogger(__name__)

RegionStatus = geo_routing_service_pb2.RegionStatus
RegionInfo = chat_service_pb2.GetRegionInfoResponse
AskRegion = Callable[[str], Awaitable[RegionInfo]]
"""The region at a ChatService address says what it is (``GetRegionInfo``);
raises when it does not answer."""
_LIVE = (common_pb2.HEALTH_STATE_SERVING, common_pb2.HEALTH_STATE_DEGRADED)


def serves(info: RegionInfo, status: RegionStatus, model: str = "") -> bool:
    """Whether ``info``, a region's own answer, says it is the region
    ``status`` names and that it serves (``model``, when given): a healthy
    engine pod and a live health."""
    report = status.report
    return (
        info.region == report.region
        and info.zone == report.zone
        and (not model or model in info.models)
        and info.healthy_engine_pods > 0
        and info.health in _LIVE
    )


def place_kept(
    listed: Sequence[RegionStatus], kept: Sequence[RegionStatus], running: Callable[[RegionStatus], int]
) -> list[RegionStatus]:
    """``listed`` in its order, with each of ``kept`` before the first region
    that runs more turns (``running``) than it does, else last."""
    merged = list(listed)
    for status in kept:
        load = running(status)
        at = next((i for i, other in enumerate(merged) if running(other) > load), len(merged))
        merged.insert(at, status)
    return merged


class RegionChecks:
    """What this edge itself finds of each region (see the module docstring).
    Not thread-safe: one event loop."""

    def __init__(
        self,
        ask: AskRegion,
        clock: Callable[[], float] = time.monotonic,
        *,
        check_ttl_s: float = 1.0,
        failure_memory_s: float = 10.0,
    ) -> None:
        self._ask = ask
        self._clock = clock
        self._check_ttl_s = check_ttl_s
        self._failure_memory_s = failure_memory_s
        self._failed_at: dict[str, float] = {}
        self._answers: dict[str, tuple[float, RegionInfo | None]] = {}
        self._asking: SingleFlight[RegionInfo | None] = SingleFlight("edge region checks")
        self.kept: set[str] = set()
        """The regions a route keeps now against geo-routing."""

    def failed(self, region: str) -> None:
        """A turn failed on ``region`` at this edge: no route keeps it for ``failure_memory_s``."""
        self._failed_at[region] = self._clock()
        self._answers.pop(region, None)

    async def reaches(self, status: RegionStatus, model: str = "") -> bool:
        """Whether this edge finds the region serving (``model``) now; see the module docstring."""
        region = status.report.region
        now = self._clock()
        failed = self._failed_at.get(region)
        if failed is not None and now - failed < self._failure_memory_s:
            return False
        answer = self._answers.get(region)
        if answer is None or now - answer[0] >= self._check_ttl_s:
            address = status.report.chat_address
            # Shielded: a caller that gives up does not cancel the check others wait for.
            info = await asyncio.shield(self._asking.start(region, lambda: self._ask_region(region, address)))
        else:
            info = answer[1]
        return info is not None and serves(info, status, model)

    async def _ask_region(self, region: str, address: str) -> RegionInfo | None:
        try:
            info: RegionInfo | None = await self._ask(address)
        except Exception as err:  # a region that cannot be asked is not found serving
            log.debug("region %s: the edge's check found no answer: %s", region, err)
            info = None
        self._answers[region] = (self._clock(), info)
        return info

    async def route(
        self,
        listed: Sequence[RegionStatus],
        previous: Sequence[RegionStatus],
        running: Callable[[RegionStatus], int],
        model: str = "",
    ) -> list[RegionStatus]:
        """Geo-routing's answer ``listed``, with the regions of ``previous``
        (the last answer to the same question, for ``model``) that it leaves
        out and this edge finds serving, placed by ``running`` (:func:`place_kept`)."""
        names = {s.report.region for s in listed}
        left_out = [s for s in previous if s.report.region not in names]
        found = await asyncio.gather(*(self.reaches(s, model) for s in left_out))
        kept = [s for s, serving in zip(left_out, found, strict=True) if serving]
        kept_names = {s.report.region for s in kept}
        for region in sorted(kept_names - self.kept):
            log.warning("region %s: geo-routing leaves it out, but this edge finds it serving", region)
        for region in sorted(({s.report.region for s in left_out} - kept_names) & self.kept):
            log.warning("region %s: left out of routing, as this edge no longer finds it serving", region)
        self.kept = (self.kept - names - {s.report.region for s in left_out}) | kept_names
        return place_kept(listed, kept, running) if kept else list(listed)

    async def close(self) -> None:
        """Cancel the checks still running."""
        await self._asking.close()
