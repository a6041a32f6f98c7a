"""A region's housekeeping of conversations: turn records retried while the
zone store is down (spooled to local disk, so a restart retries them too),
summaries of long branches, the extractor of end users' facts
(:mod:`region.knowledge.memory_model`), the purge of deleted conversations after
their retention, and the purge of deleted tenants' data
(:mod:`region.lifecycle.tenant_purge`).

:func:`build_lifecycle` makes them for the region's gateway to be built
with; :meth:`RegionLifecycle.start` retries what a previous run spooled and
starts the purge's background sweep, :meth:`RegionLifecycle.close` stops
them (the gateway's drain waits for the records still being retried).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa

from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.core.usage_purpose import MEMORY, SUMMARY
from llmmesh.region.admission.control import Admission
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.knowledge.memory_model import Extract, fact_extractor
from llmmesh.region.lifecycle.background_usage import BackgroundUsage
from llmmesh.region.lifecycle.housekeeping_model import HousekeepingModel
from llmmesh.region.lifecycle.purge import ConversationPurge, TenantPolicies
from llmmesh.region.lifecycle.retry import RecordRetries
from llmmesh.region.lifecycle.spool import RecordSpool
from llmmesh.region.lifecycle.summaries import Summaries
from llmmesh.region.lifecycle.tenant_purge import SWEEP_INTERVAL_S, DeletedTenants, TenantData, TenantPurge
from llmmesh.region.settings import RegionSettings
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)


@dataclass
class RegionLifecycle:
    """The housekeeping a region runs: record retries, the purge sweeps, its
    summaries if enabled, and the extractor of end users' facts."""

    store: ZoneStore
    retries: RecordRetries
    purge: ConversationPurge
    summaries: Summaries | None
    extract: Extract
    interval_s: float
    tenant_purge: TenantPurge | None = None
    task: asyncio.Task[None] | None = field(default=None, init=False)
    tenant_task: asyncio.Task[None] | None = field(default=None, init=False)

    def start(self) -> None:
        """Retry the records a previous run spooled, and start the purge sweeps."""
        self.retries.resume(self.store)
        self.task = asyncio.create_task(self._sweeps(), name="conversation-purge")
        if self.tenant_purge is not None:
            self.tenant_task = asyncio.create_task(
                self._tenant_sweeps(self.tenant_purge), name="deleted-tenant-purge"
            )

    async def close(self) -> None:
        await cancel_and_wait(self.task)
        await cancel_and_wait(self.tenant_task)
        if self.summaries is not None:
            await self.summaries.close()

    async def _sweeps(self) -> None:
        # Runs until closed; each sweep is bounded by the purge's batches.
        while True:
            try:
                await self.purge.sweep()
            except Exception:
                log.exception("the purge of deleted conversations failed; trying again next sweep")
            await asyncio.sleep(self.interval_s)

    async def _tenant_sweeps(self, purge: TenantPurge) -> None:
        while True:
            try:
                await purge.sweep()
            except Exception:
                log.exception("the purge of deleted tenants' data failed; trying again next sweep")
            await asyncio.sleep(SWEEP_INTERVAL_S)


class ZonePolicies(TenantPolicies, DeletedTenants, Protocol):
    """The zone's tenants, live and deleted, as the region's policy cache holds them."""


def build_lifecycle(
    settings: RegionSettings,
    store: ZoneStore,
    shipper: UsageShipper,
    pool: EnginePool,
    models: ModelResolver,
    policies: ZonePolicies,
    admission: Admission,
    embedding_models: Callable[[], Collection[str]] = tuple,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    tenant_data: Sequence[TenantData] = (),
) -> RegionLifecycle:
    """The region's housekeeping, not started yet. ``tenant_data`` are the
    zone's stores besides ``store`` that keep tenants' data (retrieval,
    memories): a deleted tenant's is purged from them and from ``store``.
    Summaries and model-extracted facts are billed to their tenants within
    their limits, through ``admission`` (:mod:`region.lifecycle.background_usage`)."""
    path = spool_path(settings)
    retries = RecordRetries(on_recorded=shipper.notify, spool=RecordSpool(path) if path else None)
    usage = BackgroundUsage(
        settings.region,
        store,
        shipper,
        admission,
        policies.tenant,
        default_per_day=settings.background_tokens_per_day,
        clock=clock,
    )
    summaries = None
    if settings.summaries_enabled:
        writer = HousekeepingModel(
            pool, models, embedding_models, settings.summary_model, usage=usage, purpose=SUMMARY
        )
        summaries = Summaries(
            store, writer.complete, writer.model, max_tokens=settings.summary_max_tokens, clock=clock
        )
    extract = fact_extractor(
        settings,
        HousekeepingModel(pool, models, embedding_models, settings.memory_model, usage=usage, purpose=MEMORY),
    )
    purge = ConversationPurge(
        store, policies, clock, default_days=settings.conversation_retention_days, batch=settings.purge_batch
    )
    tenant_purge = TenantPurge(policies, [store, *tenant_data])
    return RegionLifecycle(store, retries, purge, summaries, extract, settings.purge_interval_s, tenant_purge)


def spool_path(settings: RegionSettings) -> Path | None:
    """Where the region spools turn records the zone store refused: in
    ``record_spool_dir``, or beside a file-backed SQLite zone store; None
    (retries in memory only) for a server store without a spool folder."""
    name = f"{settings.region}.pending-turns.jsonl"
    if settings.record_spool_dir:
        return Path(settings.record_spool_dir) / name
    url = sa.engine.make_url(settings.zone_store_database_url())
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(url.database).parent / name
    return None
