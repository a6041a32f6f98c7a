"""End users' pseudonyms: the only form in which a tenant's end-user ids
leave their zone.

A turn's usage row keeps the end user as the tenant named it, in the zone
store; what the usage shipper sends to billing carries its pseudonym
instead (:func:`llmmesh.core.end_user.end_user_pseudonym`), keyed by the
zone's secret (:mod:`region.zone_store.zone_keys`). Every region of the
zone reads the same secret, so an end user has one pseudonym in the zone
whichever region served it, and rows an earlier release left in the outbox
ship pseudonymised too.
"""

from __future__ import annotations

import asyncio

from llmmesh.core.end_user import end_user_pseudonym
from llmmesh.region.zone_store.store import ZoneStore, utc_now
from llmmesh.region.zone_store.zone_keys import END_USER_PSEUDONYM, zone_key
from llmmesh.v1 import billing_service_pb2


class EndUserPseudonyms:
    """Computes pseudonyms with the zone's key, read (or made) from ``store``
    on first use and kept for the life of the process."""

    def __init__(self, store: ZoneStore) -> None:
        self._store = store
        self._secret: bytes | None = None
        self._loading = asyncio.Lock()

    async def _key(self) -> bytes:
        async with self._loading:
            if self._secret is None:
                store = self._store
                self._secret = await store.transaction(
                    lambda conn: zone_key(conn, store.zone, END_USER_PSEUDONYM, store.region, utc_now())
                )
            return self._secret

    async def load(self) -> None:
        """Read (or make) the zone's key now rather than at first use."""
        await self._key()

    async def of(self, tenant_id: str, end_user: str) -> str:
        """The pseudonym of ``tenant_id``'s ``end_user``; empty for no end user."""
        if not end_user:
            return ""
        return end_user_pseudonym(await self._key(), tenant_id, end_user)

    async def outbound(self, usage: bytes) -> billing_service_pb2.UsageRecord:
        """A serialized usage row as it may leave the zone: its end user pseudonymised."""
        record = billing_service_pb2.UsageRecord.FromString(usage)
        record.end_user = await self.of(record.tenant_id, record.end_user)
        return record
