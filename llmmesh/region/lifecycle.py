"""A region's housekeeping of conversations: turn records retried while the
zone store is down (spooled to local disk, so a restart retries them too),
summaries of long branches, the extractor of end users' facts
(:mod:`region.memory_model`), and the purge of deleted conversations after
their retention.

:func:`start_lifecycle` wires them into a running region's gateway and
starts the purge's background sweep; :meth:`RegionLifecycle.close` stops
them (the gateway's drain waits for the records still being retried).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.gateway import ChatGateway
from llmmesh.region.lifecycle.housekeeping_model import HousekeepingModel
from llmmesh.region.lifecycle.purge import ConversationPurge, TenantPolicies
from llmmesh.region.lifecycle.retry import RecordRetries
from llmmesh.region.lifecycle.spool import RecordSpool
from llmmesh.region.knowledge.memory_model import fact_extractor
from llmmesh.region.settings import RegionSettings
from llmmesh.region.lifecycle.summaries import Summaries
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)


@dataclass
class RegionLifecycle:
    """The housekeeping a region runs: its purge sweep, and its summaries if enabled."""

    purge: ConversationPurge
    summaries: Summaries | None
    interval_s: float
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._sweeps(), name="conversation-purge")

    async def close(self) -> None:
        await cancel_and_wait(self.task)
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


def start_lifecycle(
    settings: RegionSettings,
    store: ZoneStore,
    gateway: ChatGateway,
    shipper: UsageShipper,
    pool: EnginePool,
    models: ModelResolver,
    policies: TenantPolicies,
    embedding_models: Callable[[], Collection[str]] = tuple,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> RegionLifecycle:
    """Give ``gateway`` its record retries and summaries, and start the purge sweep."""
    path = spool_path(settings)
    retries = RecordRetries(on_recorded=shipper.notify, spool=RecordSpool(path) if path else None)
    gateway.record_retries = retries
    retries.resume(store)
    summaries = None
    if settings.summaries_enabled:
        writer = HousekeepingModel(pool, models, embedding_models, settings.summary_model)
        summaries = Summaries(
            store, writer.complete, writer.model, max_tokens=settings.summary_max_tokens, clock=clock
        )
        gateway.summaries = summaries
    if gateway.memory is not None:
        gateway.memory.extract = fact_extractor(
            settings, HousekeepingModel(pool, models, embedding_models, settings.memory_model)
        )
    purge = ConversationPurge(
        store, policies, clock, default_days=settings.conversation_retention_days, batch=settings.purge_batch
    )
    lifecycle = RegionLifecycle(purge, summaries, settings.purge_interval_s)
    lifecycle.start()
    return lifecycle


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
