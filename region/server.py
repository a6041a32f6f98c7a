"""Starting and stopping one region plane."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc.aio

from llmmesh import lifecycle
from llmmesh.errors import InvalidArgument, Reason
from llmmesh.grpcserver import GrpcServer, open_channel
from llmmesh.ids import is_valid_name
from llmmesh.model_resolver import ModelResolver
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    geo_routing_service_pb2,
    geo_routing_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from region.engine_pool import EnginePool
from region.gateway import ChatGateway
from region.heartbeat import Heartbeater
from region.policy_cache import PolicyCache
from region.servicer import ChatServicer, region_health
from region.settings import RegionSettings
from region.usage_shipper import UsageShipper
from region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)

SERVICE_NAME = "llmmesh.v1.ChatService"


def parse_location(text: str) -> common_pb2.GeoPoint:
    """A 'lat,lon' setting as a GeoPoint."""
    try:
        lat_text, lon_text = text.split(",")
        lat, lon = float(lat_text), float(lon_text)
    except ValueError as exc:
        raise InvalidArgument(Reason.INVALID_REQUEST, f"location must be 'lat,lon', got {text!r}") from exc
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise InvalidArgument(Reason.INVALID_REQUEST, f"location out of range: {text!r}")
    return common_pb2.GeoPoint(latitude=lat, longitude=lon)


@dataclass
class RegionPlane:
    """A running region: its server and the parts tests reach into."""

    settings: RegionSettings
    address: str
    server: GrpcServer
    global_channel: grpc.aio.Channel
    pool: EnginePool
    policy: PolicyCache
    gateway: ChatGateway
    store: ZoneStore
    shipper: UsageShipper
    heartbeat: Heartbeater

    def info(self) -> chat_service_pb2.GetRegionInfoResponse:
        healthy = len(self.pool.healthy_pods)
        return chat_service_pb2.GetRegionInfoResponse(
            region=self.settings.region,
            zone=self.settings.zone,
            models=self.pool.models,
            engine_pods=len(self.pool.pods),
            healthy_engine_pods=healthy,
            health=region_health(healthy, len(self.pool.pods)),
        )

    def report(self) -> geo_routing_service_pb2.RegionReport:
        info = self.info()
        capacity = sum(p.info.max_num_seqs for p in self.pool.healthy_pods)
        return geo_routing_service_pb2.RegionReport(
            region=info.region,
            zone=info.zone,
            chat_address=self.address,
            health=info.health,
            capacity=capacity,
            queue_depth=sum(p.in_flight for p in self.pool.pods),
            models=info.models,
            location=parse_location(self.settings.location),
            engine_pods=info.engine_pods,
            healthy_engine_pods=info.healthy_engine_pods,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain streams, stop reporting, deliver pending usage."""
        await self.server.stop(grace_s)
        await self.heartbeat.close()
        await self.policy.close()
        await self.gateway.drain()
        await self.shipper.close()
        await asyncio.to_thread(self.store.dispose)
        await self.pool.close()
        await self.global_channel.close()


async def start_region(settings: RegionSettings) -> RegionPlane:
    """Start a region plane in this process and return it serving."""
    for name, value in (("region", settings.region), ("zone", settings.zone)):
        if not is_valid_name(value):
            raise InvalidArgument(Reason.INVALID_REQUEST, f"invalid {name} name {value!r}")
    parse_location(settings.location)
    if not settings.engine_address_list():
        raise InvalidArgument(Reason.INVALID_REQUEST, "a region needs at least one engine address")
    global_channel = open_channel(settings.global_address)
    policy = PolicyCache(
        policy_service_pb2_grpc.PolicyServiceStub(global_channel),
        settings.zone,
        refresh_s=settings.policy_refresh_ms / 1000,
        max_staleness_s=settings.policy_max_staleness_ms / 1000,
    )
    models = ModelResolver(model_registry_service_pb2_grpc.ModelRegistryServiceStub(global_channel))
    pool = EnginePool(settings.engine_address_list(), settings.engine_health_interval_ms / 1000)
    store = await ZoneStore.open(settings.zone_store_database_url(), settings.zone, settings.region)
    shipper = UsageShipper(store, billing_service_pb2_grpc.BillingServiceStub(global_channel))
    gateway = ChatGateway(settings, policy, models, pool, store, shipper)
    plane: RegionPlane | None = None

    def info() -> chat_service_pb2.GetRegionInfoResponse:
        assert plane is not None
        return plane.info()

    servicer = ChatServicer(gateway, info)
    server = GrpcServer(
        lambda s: chat_service_pb2_grpc.add_ChatServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
        settings.host,
        settings.port,
    )
    await pool.check()
    await policy.refresh()
    address = await server.start()
    heartbeat = Heartbeater(
        geo_routing_service_pb2_grpc.GeoRoutingServiceStub(global_channel),
        lambda: plane.report() if plane else geo_routing_service_pb2.RegionReport(),
        settings.heartbeat_interval_ms / 1000,
    )
    plane = RegionPlane(
        settings, address, server, global_channel, pool, policy, gateway, store, shipper, heartbeat
    )
    pool.start()
    policy.start()
    shipper.start()
    heartbeat.start()
    await heartbeat.beat()
    log.info("region %s (zone %s) serving ChatService on %s", settings.region, settings.zone, address)
    return plane


async def serve(settings: RegionSettings) -> None:
    """Run a region until SIGTERM or SIGINT, then drain."""
    stop = lifecycle.stop_event()
    plane = await start_region(settings)
    lifecycle.write_ready_file(
        settings.ready_file, {"address": plane.address, "region": settings.region, "zone": settings.zone}
    )
    await stop.wait()
    log.info("region %s draining", settings.region)
    await plane.stop()
