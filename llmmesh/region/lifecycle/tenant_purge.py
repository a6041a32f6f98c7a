"""The purge of a deleted tenant's zone-bound data.

The global plane marks a tenant deleted (``PolicyService.DeleteTenant``),
revokes its keys and lists its id in the zone's policy snapshot
(``deleted_tenant_ids``). From the snapshot on, the region refuses the
tenant's keys, and this sweep removes what the zone keeps of it: every
conversation with its messages and summaries, every file, vector store and
chunk (with their index entries), and every fact about its end users. Usage
rows stay: they are billing's, and are still shipped.

A turn already running when the tenant was deleted may still record after
the first sweep, so a region purges each deleted tenant on every sweep for
``grace_s`` after it first saw the deletion, then leaves it. A restarted
region purges the deleted tenants again for that grace (each purge of
nothing is a few indexed deletes). Every region of the zone purges; the
stores are the zone's, so the deletes are idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 10.0
"""Seconds between sweeps: a deleted tenant's data is gone within this of the snapshot."""
GRACE_S = 900.0
"""Seconds a deleted tenant is purged again on every sweep, for turns that were still running."""


class DeletedTenants(Protocol):
    """The zone's deleted tenants as the region's policy cache holds them."""

    def deleted_tenant_ids(self) -> list[str]: ...


class TenantData(Protocol):
    """A zone store that keeps data of tenants and can remove all of one's."""

    async def purge_tenant(self, tenant_id: str) -> int: ...


class TenantPurge:
    """Removes the deleted tenants' data from ``stores``."""

    def __init__(
        self,
        tenants: DeletedTenants,
        stores: Sequence[TenantData],
        *,
        grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tenants = tenants
        self._stores = tuple(stores)
        self._grace_s = grace_s
        self._clock = clock
        self._first_seen: dict[str, float] = {}

    async def sweep(self) -> int:
        """Purge every deleted tenant still within its grace; how many rows went."""
        now = self._clock()
        removed = 0
        for tenant_id in self._tenants.deleted_tenant_ids():
            if now - self._first_seen.setdefault(tenant_id, now) > self._grace_s:
                continue
            gone = 0
            for store in self._stores:
                gone += await store.purge_tenant(tenant_id)
            if gone:
                log.info("purged %d rows of deleted tenant %s from the zone's stores", gone, tenant_id)
            removed += gone
        return removed
