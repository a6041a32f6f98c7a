"""Periodic heartbeats to the global region directory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import geo_routing_service_pb2, geo_routing_service_pb2_grpc

log = logging.getLogger(__name__)


class Heartbeater:
    """Sends this region's report every interval; the directory marks a
    region down when reports stop."""

    def __init__(
        self,
        stub: geo_routing_service_pb2_grpc.GeoRoutingServiceStub,
        report: Callable[[], geo_routing_service_pb2.RegionReport],
        interval_s: float,
    ) -> None:
        self._stub = stub
        self._report = report
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._reachable = True

    async def beat(self) -> bool:
        """Send one heartbeat; False when the directory is unreachable."""
        try:
            resp = await self._stub.Heartbeat(
                geo_routing_service_pb2.HeartbeatRequest(report=self._report()), timeout=2.0
            )
        except grpc.aio.AioRpcError as err:
            if self._reachable:
                log.warning("heartbeat failed: %s %s", err.code().name, err.details())
            self._reachable = False
            return False
        if not self._reachable:
            log.info("heartbeats delivered again")
        self._reachable = True
        if resp.interval_ms > 0:
            self._interval_s = resp.interval_ms / 1000
        return True

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
