"""Periodic heartbeats to the global region directory, and the per-model
pod counts they carry (the registry's deployments of each model)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import grpc

from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_pool import EnginePodHandle
from llmmesh.v1 import geo_routing_service_pb2, geo_routing_service_pb2_grpc

log = logging.getLogger(__name__)


def model_pods(
    pods: Iterable[EnginePodHandle], embedding: Mapping[str, Sequence[EnginePodHandle]]
) -> list[geo_routing_service_pb2.ModelPods]:
    """Engine pods per model, by name: the chat model each of ``pods``
    serves, and the embedding models of ``embedding`` (a pod counts once
    for each model it serves). A pod whose model is not known yet counts
    for none."""
    serving: dict[str, dict[str, EnginePodHandle]] = {}
    for pod in pods:
        if pod.model:
            serving.setdefault(pod.model, {})[pod.address] = pod
    for model, embedders in embedding.items():
        for pod in embedders:
            serving.setdefault(model, {})[pod.address] = pod
    return [
        geo_routing_service_pb2.ModelPods(
            model=model,
            engine_pods=len(by_address),
            healthy_engine_pods=sum(1 for p in by_address.values() if p.healthy),
        )
        for model, by_address in sorted(serving.items())
    ]


class Heartbeater:
    """Sends this region's report every interval; the directory marks a
    region down when reports stop. The answers carry the model catalog's
    version; ``on_catalog_change`` is called when it changes."""

    def __init__(
        self,
        stub: geo_routing_service_pb2_grpc.GeoRoutingServiceStub,
        report: Callable[[], geo_routing_service_pb2.RegionReport],
        interval_s: float,
        on_catalog_change: Callable[[], None] | None = None,
    ) -> None:
        self._stub = stub
        self._report = report
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._reachable = True
        # Called when the answers' model catalog version changes (not on the first one heard).
        self._on_catalog_change = on_catalog_change
        self.catalog_version = ""

    @property
    def delivered(self) -> bool:
        """Whether the last heartbeat sent reached the directory."""
        return self._reachable

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
        heard = resp.model_catalog_version
        if heard and heard != self.catalog_version:
            if self.catalog_version and self._on_catalog_change is not None:
                log.info("the model catalog changed (version %s); forgetting cached registry answers", heard)
                self._on_catalog_change()
            self.catalog_version = heard
        return True

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
