"""The purge of soft-deleted conversations after their retention period.

A deleted conversation hides from every read at once; its content (messages
and summaries) stays in the zone store for a retention period, then this
sweep removes it for good. The period is the tenant's policy
(``Tenant.conversation_retention_days``) or, where it sets none, the
region's default. Each region purges the conversations it homes, in
bounded batches, oldest deletion first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import policy_service_pb2

log = logging.getLogger(__name__)


class TenantPolicies(Protocol):
    """The tenants of the zone as the region's policy cache holds them."""

    def tenants(self) -> list[policy_service_pb2.Tenant]: ...

    def tenant(self, tenant_id: str) -> policy_service_pb2.Tenant | None: ...


class ConversationPurge:
    """Purges the deleted conversations of ``store``'s region whose retention ended."""

    def __init__(
        self,
        store: ZoneStore,
        policies: TenantPolicies,
        clock: Callable[[], datetime],
        *,
        default_days: int,
        batch: int = 100,
        max_batches: int = 100,
    ) -> None:
        if default_days < 0 or batch < 1 or max_batches < 1:
            raise ValueError("retention must be >= 0 days, batches >= 1")
        self._store = store
        self._policies = policies
        self._clock = clock
        self._default = timedelta(days=default_days)
        self._batch = batch
        self._max_batches = max_batches

    def retention(self, tenant_id: str) -> timedelta:
        """How long the tenant's deleted conversations are kept."""
        tenant = self._policies.tenant(tenant_id)
        days = tenant.conversation_retention_days if tenant is not None else 0
        return timedelta(days=days) if days > 0 else self._default

    async def sweep(self) -> int:
        """Purge what is due now, at most ``batch * max_batches`` conversations
        looked at; how many were purged."""
        now = self._clock()
        overrides = [timedelta(days=t.conversation_retention_days) for t in self._policies.tenants()]
        shortest = min([self._default, *(o for o in overrides if o > timedelta(0))])
        after: tuple[datetime, str] | None = None
        purged = 0
        for _ in range(self._max_batches):
            page = await self._store.deleted_conversations(now - shortest, after, self._batch)
            for deleted in page:
                if await self._store.purge_conversation(deleted.id, now - self.retention(deleted.tenant_id)):
                    purged += 1
            if len(page) < self._batch:
                break
            after = (page[-1].deleted_at, page[-1].id)
        if purged:
            log.info("purged %d deleted conversations past their retention", purged)
        return purged
