"""What geo-routing answers for the drill's tenant, sampled through the drill.

Every ``interval_s`` the watch asks the global plane's GeoRoutingService
``Route`` for the tenant (what the edge asks before every turn) and keeps
the regions it lists. ``NO_REGION_IN_ZONE`` is an empty list; a global
plane that does not answer is a sample of ``None``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, from_rpc_error
from llmmesh.drill.target import Dial
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import geo_routing_service_pb2_grpc

ROUTE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RoutingSample:
    """One answer: when it came (monotonic) and the regions routed to; None when there was none."""

    at: float
    regions: frozenset[str] | None


class RoutingWatch:
    """Samples ``Route`` for one tenant until stopped, on a channel ``dial`` opens to the global plane."""

    def __init__(self, dial: Dial, tenant_id: str, interval_s: float) -> None:
        self._dial = dial
        self._tenant_id = tenant_id
        self._interval_s = interval_s
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.samples: list[RoutingSample] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="drill-routing-watch")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def first_after(self, start: float, *, listing: str, listed: bool) -> float | None:
        """When, at or after ``start``, geo-routing first answered with ``listing``
        among the regions (``listed``) or not among them (not ``listed``)."""
        for sample in self.samples:
            if sample.at >= start and sample.regions is not None and (listing in sample.regions) == listed:
                return sample.at
        return None

    def first_answer_after(self, start: float) -> float | None:
        """When, at or after ``start``, geo-routing first answered at all."""
        return next((s.at for s in self.samples if s.at >= start and s.regions is not None), None)

    async def _run(self) -> None:
        async with self._dial() as channel:
            geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
            request = gpb.RouteRequest(tenant_id=self._tenant_id)
            while not self._stop.is_set():
                regions: frozenset[str] | None
                try:
                    routed = await geo.Route(request, timeout=ROUTE_TIMEOUT_S)
                    regions = frozenset(str(s.report.region) for s in routed.regions)
                except grpc.aio.AioRpcError as err:
                    regions = frozenset() if from_rpc_error(err).reason == Reason.NO_REGION_IN_ZONE else None
                self.samples.append(RoutingSample(time.monotonic(), regions))
                try:
                    await asyncio.wait_for(self._stop.wait(), self._interval_s)
                except TimeoutError:
                    pass
