"""The global plane as one gRPC server: policy, billing, model registry, geo-routing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc.aio

from llmmesh.core import lifecycle
from llmmesh.core.access import AccessPolicy
from llmmesh.core.addresses import advertised_address, advertised_url, check_advertisable
from llmmesh.core.errors import AlreadyExists, Reason, Unauthenticated
from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.identity import Role
from llmmesh.core.metrics_http import MetricsEndpoint
from llmmesh.globalplane import access as global_access
from llmmesh.globalplane import billing_servicer, geo_routing_servicer, policy_servicer, registry_servicer
from llmmesh.globalplane import metrics as global_metrics
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.billing_servicer import BillingServicer
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.directory_sync import DirectorySync
from llmmesh.globalplane.embedding_models import embedding_models
from llmmesh.globalplane.geo_routing_servicer import GeoRoutingServicer
from llmmesh.globalplane.model_catalog import ModelCatalog, ModelDeployment, default_model
from llmmesh.globalplane.policy_servicer import PolicyServicer, ZoneCheck
from llmmesh.globalplane.region_directory import RegionDirectory
from llmmesh.globalplane.region_reports import RegionReportBook
from llmmesh.globalplane.registry_servicer import ModelRegistryServicer
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore, default_database_url
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.globalplane.usage_ledger import UsageLedger
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    geo_routing_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    policy_service_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    policy_servicer.SERVICE_NAME,
    billing_servicer.SERVICE_NAME,
    registry_servicer.SERVICE_NAME,
    geo_routing_servicer.SERVICE_NAME,
)


@dataclass
class GlobalBooks:
    """The books behind the global plane's services: tenants and keys, the
    model catalog, the usage ledger and the region directory."""

    tenants: TenantBook
    catalog: ModelCatalog
    ledger: UsageLedger
    directory: RegionDirectory


@dataclass
class GlobalPlane:
    """A running global plane: its address, its store and the books over it
    (each book also reachable by name), its server and metrics endpoint, and
    the task that keeps its region directory in step with its peers'."""

    address: str
    settings: GlobalSettings
    store: GlobalStore
    books: GlobalBooks
    server: GrpcServer
    metrics: MetricsEndpoint | None = None
    directory_sync: asyncio.Task[None] | None = None

    @property
    def tenants(self) -> TenantBook:
        return self.books.tenants

    @property
    def catalog(self) -> ModelCatalog:
        return self.books.catalog

    @property
    def ledger(self) -> UsageLedger:
        return self.books.ledger

    @property
    def directory(self) -> RegionDirectory:
        return self.books.directory

    @property
    def metrics_url(self) -> str:
        """Where others scrape this plane's /metrics: its advertised host, the endpoint's port."""
        return advertised_url(self.metrics.url, self.address) if self.metrics else ""

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain: refuse new calls and give running ones ``grace_s`` to finish; then close the store."""
        await self.server.stop(grace_s)
        if self.directory_sync is not None:
            self.directory_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.directory_sync
        self.store.dispose()
        global_metrics.DIRECTORIES.remove(self.directory)
        if self.metrics is not None:
            self.metrics.stop()


async def ensure_dev_tenant(tenants: TenantBook, settings: GlobalSettings) -> None:
    """Make sure tenant ``dev_tenant`` exists and ``dev_key`` authenticates as it.

    Idempotent, because the store outlives the process: a restart finds
    both already there. A dev key that was revoked stays revoked; a dev
    tenant stored in another zone keeps its zone (zones never change).
    """
    try:
        dev = await tenants.create_tenant(
            settings.dev_tenant, settings.dev_zone, TenantTier.parse(settings.dev_tier)
        )
    except AlreadyExists:
        dev = await tenants.get_tenant(settings.dev_tenant)
        if dev.zone != settings.dev_zone:
            log.warning("dev tenant %r is pinned to zone %r, not %r", dev.name, dev.zone, settings.dev_zone)
    try:
        await tenants.authenticate(settings.dev_key)
    except Unauthenticated as err:
        if err.reason != Reason.API_KEY_INVALID:
            log.warning("the dev API key is unusable: %s", err.message)
            return
        await tenants.create_api_key(dev.id, secret=settings.dev_key)


def known_zones(settings: GlobalSettings, directory: RegionDirectory) -> ZoneCheck | None:
    """The zones a tenant may be created in: those ``settings.zones``
    configures and those of every region that has reported; None (no check)
    when no zone is configured, since the plane then knows no topology."""
    configured = frozenset(z.strip() for z in settings.zones.split(",") if z.strip())
    if not configured:
        return None
    return lambda: configured | directory.zones()


async def start_global_plane(settings: GlobalSettings, clock: Clock = utc_now) -> GlobalPlane:
    """Open the store, bootstrap the default model and dev tenant, and serve on ``settings.host:port``.

    The store is ``settings.database_url``, or SQLite under ``$LLMMESH_HOME``
    when that is empty; missing tables are created. When ``settings.dev_key``
    is non-empty, tenant ``settings.dev_tenant`` (zone ``dev_zone``, tier
    ``dev_tier``) exists with an API key whose secret is ``dev_key``.
    """
    check_advertisable(settings.host, settings.advertise_address, "the global plane")
    security = settings.mesh_security("global")
    security.expect_role(Role.GLOBAL)
    store = await GlobalStore.open(settings.database_url or default_database_url())
    try:
        tenants = TenantBook(store, clock)
        directory = RegionDirectory(
            settings.heartbeat_interval_ms, settings.missed_heartbeats_until_down, clock
        )
        # A restart routes at once, on the regions' last heartbeats; then
        # every interval brings in those the other replicas received.
        reports = RegionReportBook(store)
        directory.restore(await reports.load())
        sync = DirectorySync(directory, reports, clock)

        def deployments(model: str) -> Sequence[ModelDeployment]:
            # Each region's pods of this model, as its heartbeat counts them.
            return [
                ModelDeployment(s.report.region, s.report.engine_pods_of(model))
                for s in directory.serving(model)
            ]

        catalog = ModelCatalog(store, deployments, clock)
        await catalog.add_missing([default_model(settings), *embedding_models(settings)])
        ledger = UsageLedger(store, clock)
        audit = AuditLog(store, clock)
        if settings.dev_key:
            await ensure_dev_tenant(tenants, settings)

        def register(server: grpc.aio.Server) -> None:
            policy_service_pb2_grpc.add_PolicyServiceServicer_to_server(
                PolicyServicer(tenants, audit, known_zones(settings, directory)), server
            )
            billing_service_pb2_grpc.add_BillingServiceServicer_to_server(
                BillingServicer(ledger, tenants), server
            )
            model_registry_service_pb2_grpc.add_ModelRegistryServiceServicer_to_server(
                ModelRegistryServicer(catalog, audit), server
            )
            geo_routing_service_pb2_grpc.add_GeoRoutingServiceServicer_to_server(
                GeoRoutingServicer(directory, tenants, reports, audit, catalog.version, sync), server
            )

        server = GrpcServer(
            register,
            SERVICE_NAMES,
            settings.host,
            settings.port,
            security=security,
            access=AccessPolicy(global_access.GLOBAL_ACCESS),
        )
        bound = await server.start()
        address = advertised_address(bound, settings.advertise_address, "the global plane")
    except BaseException:
        store.dispose()
        raise
    global_metrics.DIRECTORIES.add(directory, clock)
    metrics = None
    if settings.metrics_port >= 0:
        metrics = MetricsEndpoint(global_metrics.REGISTRY, settings.host, settings.metrics_port)
    books = GlobalBooks(tenants, catalog, ledger, directory)
    syncing = asyncio.create_task(sync.run(), name="region-directory-sync")
    return GlobalPlane(address, settings, store, books, server, metrics, syncing)


async def serve(settings: GlobalSettings) -> None:
    """Run the global plane until SIGTERM or SIGINT, then drain."""
    stop = lifecycle.stop_event()
    plane = await start_global_plane(settings)
    lifecycle.settle_heap()
    lifecycle.write_ready_file(
        settings.ready_file, {"address": plane.address, "metrics_url": plane.metrics_url}
    )
    log.info("global plane serving on %s", plane.address)
    try:
        await stop.wait()
    finally:
        log.info("global plane draining")
        await plane.stop()
