"""``GeoRoutingService``: a thin gRPC face on :class:`RegionDirectory`.

Heartbeats are also kept in the global store (when a :class:`RegionReportBook`
is given) so that a restarted global plane routes at once and, with a
:class:`DirectorySync`, every replica routes on the heartbeats any replica
received; removing a region is an operator's call, audited.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import sqlalchemy as sa

from llmmesh.core.access import require_caller
from llmmesh.core.identity import Role
from llmmesh.globalplane import metrics as global_metrics
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.directory_sync import DirectorySync
from llmmesh.globalplane.protoconv import health_from_proto, health_to_proto, timestamp
from llmmesh.globalplane.region_directory import (
    GeoPoint,
    ModelPodCount,
    RegionDirectory,
    RegionReport,
    RegionStatus,
)
from llmmesh.globalplane.region_reports import RegionReportBook
from llmmesh.globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.v1 import common_pb2, geo_routing_service_pb2_grpc
from llmmesh.v1 import geo_routing_service_pb2 as gpb

SERVICE_NAME = "llmmesh.v1.GeoRoutingService"
log = logging.getLogger(__name__)


def report_from_proto(report: gpb.RegionReport) -> RegionReport:
    location = report.location if report.HasField("location") else None
    return RegionReport(
        region=report.region,
        zone=report.zone,
        chat_address=report.chat_address,
        health=health_from_proto(report.health),
        capacity=report.capacity,
        queue_depth=report.queue_depth,
        models=tuple(report.models),
        location=GeoPoint(location.latitude, location.longitude) if location is not None else None,
        engine_pods=report.engine_pods,
        healthy_engine_pods=report.healthy_engine_pods,
        model_pods=tuple(
            ModelPodCount(m.model, m.engine_pods, m.healthy_engine_pods) for m in report.model_pods
        ),
    )


def report_to_proto(report: RegionReport) -> gpb.RegionReport:
    proto = gpb.RegionReport(
        region=report.region,
        zone=report.zone,
        chat_address=report.chat_address,
        health=health_to_proto(report.health),
        capacity=report.capacity,
        queue_depth=report.queue_depth,
        models=report.models,
        engine_pods=report.engine_pods,
        healthy_engine_pods=report.healthy_engine_pods,
        model_pods=[
            gpb.ModelPods(model=m.model, engine_pods=m.engine_pods, healthy_engine_pods=m.healthy_engine_pods)
            for m in report.model_pods
        ],
    )
    if report.location is not None:
        proto.location.CopyFrom(
            common_pb2.GeoPoint(latitude=report.location.latitude, longitude=report.location.longitude)
        )
    return proto


def status_to_proto(status: RegionStatus) -> gpb.RegionStatus:
    return gpb.RegionStatus(
        report=report_to_proto(status.report),
        last_heartbeat_time=timestamp(status.last_heartbeat_time),
        effective_health=health_to_proto(status.effective_health),
    )


# Method names are the RPC names the generated base class declares (hence N802).
class GeoRoutingServicer(geo_routing_service_pb2_grpc.GeoRoutingServiceServicer):
    """Region heartbeats and zone-bound routing."""

    def __init__(
        self,
        directory: RegionDirectory,
        tenants: TenantBook,
        reports: RegionReportBook | None = None,
        audit: AuditLog | None = None,
        catalog_version: Callable[[], Awaitable[str]] | None = None,
        sync: DirectorySync | None = None,
    ) -> None:
        self._directory = directory
        self._tenants = tenants
        self._reports = reports
        self._audit = audit
        # The model catalog's fingerprint, sent with every heartbeat answer.
        self._catalog_version = catalog_version
        # Brings in the heartbeats other replicas received, once an interval.
        self._sync = sync

    async def Route(self, request: gpb.RouteRequest, context: ServicerContext) -> gpb.RouteResponse:
        async with abort_on_mesh_error(context), global_metrics.routing_refusals():
            # From memory, never the database: the edge asks before every turn
            # (the directory reads the store once an interval, not per call).
            await self._refresh()
            zone = await self._tenants.zone_of(request.tenant_id)
            regions = self._directory.route(
                zone,
                model=request.model,
                location_hint=request.client_location_hint,
                preferred_region=request.preferred_region,
            )
            global_metrics.routed(zone, regions)
            return gpb.RouteResponse(zone=zone, regions=[status_to_proto(s) for s in regions])

    async def Heartbeat(
        self, request: gpb.HeartbeatRequest, context: ServicerContext
    ) -> gpb.HeartbeatResponse:
        async with abort_on_mesh_error(context):
            report = request.report
            require_caller(
                (Role.REGION,),
                f"report for region {report.region} of zone {report.zone}",
                zone=report.zone,
                region=report.region,
            )
            heard = report_from_proto(report)
            await self._refresh()
            self._directory.heartbeat(heard)
            await self._keep(heard)
            return gpb.HeartbeatResponse(
                interval_ms=self._directory.interval_ms,
                missed_heartbeats_until_down=self._directory.missed_until_down,
                model_catalog_version=await self._catalog_version() if self._catalog_version else "",
            )

    async def ListRegions(
        self, request: gpb.ListRegionsRequest, context: ServicerContext
    ) -> gpb.ListRegionsResponse:
        async with abort_on_mesh_error(context):
            await self._refresh()
            page = self._directory.list_regions(request.zone, request.page_size, request.page_token)
            return gpb.ListRegionsResponse(
                regions=[status_to_proto(s) for s in page.items], next_page_token=page.next_page_token
            )

    async def RemoveRegion(
        self, request: gpb.RemoveRegionRequest, context: ServicerContext
    ) -> gpb.RemoveRegionResponse:
        async with abort_on_mesh_error(context):
            await self._refresh()
            removed = self._directory.remove(request.region)
            if self._reports is not None:
                await self._reports.delete(request.region)
            if self._audit is not None:
                await self._audit.record("RemoveRegion", request.region, request)
            return gpb.RemoveRegionResponse(region=status_to_proto(removed))

    async def _refresh(self) -> None:
        if self._sync is not None:
            await self._sync.refresh_if_due()

    async def _keep(self, report: RegionReport) -> None:
        """Write the heartbeat to the store (one row per region, updated in place).

        A failed write is logged, not refused: this replica holds the
        heartbeat; its peers and a restart see the next one that is kept.
        """
        status = self._directory.status(report.region)
        if self._reports is None or status is None:
            return
        try:
            await self._reports.save(report, status.last_heartbeat_time)
        except sa.exc.SQLAlchemyError as err:
            log.warning("region %s: heartbeat not kept in the store: %s", report.region, err)
