"""Ships the zone store's durable usage rows to the global BillingService.

Rows are written in the same transaction as the turn they meter
(:meth:`ZoneStore.record_turn`), so a turn is never billed without being
recorded or recorded without being billed, and a region restart loses
nothing: the next shipper finds every unshipped row. A row is marked shipped
only after ``RecordUsage`` succeeded; if the region dies in between, the row
is sent again and billing, which ingests idempotently by tenant and request
id, counts it as a duplicate. Rows are told apart the same way: two
tenants' turns may share a request id, and each is billed and marked
shipped on its own. While the global plane is down the shipper backs off
exponentially.

Shipments are batched: a turn's row does not ship on its own the moment it
is recorded. The shipper waits ``linger_s`` after the first new row, so the
rows of the turns that end meanwhile (and those recorded while a shipment
is in flight) go in one ``RecordUsage`` call, one billing transaction and
one outbox update; a full batch ships at once. Billing learns of a turn at
most ``linger_s`` later; the turn itself never waits for billing.

Billing takes a batch all or nothing. When it rejects one (a record it will
not accept, such as one of a deleted tenant), the shipper sends that batch's
records one at a time, so the others still get through; a rejected record
stays pending with its attempts counted and is retried after the rest.

Records leave the zone here, and only here: each one's end user is replaced
by its pseudonym (:mod:`region.end_user_pseudonyms`) as the batch is sent;
the zone store keeps the end user as the tenant named it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Sequence

import grpc
import grpc.aio

from llmmesh.core import tracing
from llmmesh.core.tasks import cancel_and_wait, wait_event
from llmmesh.region import metrics as region_metrics
from llmmesh.region.end_user_pseudonyms import EndUserPseudonyms
from llmmesh.region.metrics import OutboxReading
from llmmesh.region.zone_store import PendingUsage, ZoneStore
from llmmesh.v1 import billing_service_pb2, billing_service_pb2_grpc

log = logging.getLogger(__name__)

# Billing judged these records, not its own health: resending the same batch cannot help.
_REJECTED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


class Shipment(enum.Enum):
    """What one :meth:`UsageShipper.ship_batch` did."""

    IDLE = "nothing was pending"
    SHIPPED = "a batch was delivered"
    FAILED = "billing could not be reached or refused a record"


class UsageShipper:
    """Drains ``store``'s usage outbox to billing in the background, end users pseudonymised."""

    def __init__(
        self,
        store: ZoneStore,
        billing: billing_service_pb2_grpc.BillingServiceStub,
        batch_size: int = 100,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        *,
        idle_poll_s: float = 5.0,
        rpc_timeout_s: float = 5.0,
        linger_s: float = 0.5,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if linger_s < 0:
            raise ValueError("linger_s must be >= 0")
        self._store = store
        self._billing = billing
        self.pseudonyms = EndUserPseudonyms(store)
        """What end users become as their records leave the zone (with ``store``'s zone key)."""
        self._batch_size = batch_size
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._idle_poll_s = idle_poll_s
        self._rpc_timeout_s = rpc_timeout_s
        self._linger_s = linger_s
        self._wakeup = asyncio.Event()
        # Rows announced since the last look; a batch's worth ends the linger early.
        self._announced = 0
        self._batch_ready = asyncio.Event()
        self._last_batch = 0
        # One batch in flight at a time: flush() and the background task never send the same rows at once.
        self._shipping = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        """Records billing accepted (or already had) through this shipper."""
        self.outbox = OutboxReading()
        """The outbox as the last batch found it, for the region's gauges."""

    def start(self) -> None:
        """Start shipping in the background, beginning with whatever an earlier process left."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-shipper")

    def notify(self) -> None:
        """Say a usage row was just recorded, so it ships within ``linger_s`` rather than at the next poll."""
        self._announced += 1
        self._wakeup.set()
        if self._announced >= self._batch_size:
            self._batch_ready.set()

    async def pending(self) -> int:
        """How many of this region's usage rows await delivery."""
        return await self._store.pending_usage_count()

    async def ship_batch(self) -> Shipment:
        """Send one batch of pending rows and mark what billing took."""
        async with self._shipping:
            rows = await self._store.pending_usage(self._batch_size)
            self._last_batch = len(rows)
            pending = await self._store.pending_usage_count() if len(rows) >= self._batch_size else len(rows)
            self.outbox.saw([row.usage for row in rows], pending)
            if not rows:
                return Shipment.IDLE
            code = await self._send(rows)
            if code is None:
                await self._delivered(rows)
                return Shipment.SHIPPED
            if code not in _REJECTED or len(rows) == 1:
                await self._store.note_attempt([row.key for row in rows])
                return Shipment.FAILED
            # Find the record billing refuses without holding back the rest.
            failed = False
            for row in rows:
                if await self._send([row]) is None:
                    await self._delivered([row])
                else:
                    failed = True
                    await self._store.note_attempt([row.key])
            return Shipment.FAILED if failed else Shipment.SHIPPED

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Ship until nothing is pending, backing off after failures; False if ``timeout_s`` ran out first."""
        backoff = self._min_backoff_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while (outcome := await self.ship_batch()) is not Shipment.IDLE:
                    if outcome is Shipment.FAILED:
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, self._max_backoff_s)
                return True
        return False

    async def close(self, drain_timeout_s: float = 3.0) -> None:
        """Stop, after trying for a while to deliver what is pending (the rest ships after a restart)."""
        await cancel_and_wait(self._task)
        self._task = None
        if not await self.flush(drain_timeout_s):
            log.warning("usage rows are still pending at shutdown; they ship when the region is back")

    async def _send(self, rows: Sequence[PendingUsage]) -> grpc.StatusCode | None:
        """None when billing took every record; otherwise the failure's code."""
        records = [await self.pseudonyms.outbound(row.usage) for row in rows]
        try:
            # A trace of its own, linked to the turns it bills: a shipment carries many.
            links = tracing.links_to_requests([row.request_id for row in rows]) if tracing.enabled() else []
            attributes: dict[str, str | int] = {"llmmesh.plane": "region", "llmmesh.usage.records": len(rows)}
            with tracing.span("usage ship", links=links, attributes=attributes):
                await self._billing.RecordUsage(
                    billing_service_pb2.RecordUsageRequest(records=records), timeout=self._rpc_timeout_s
                )
        except grpc.aio.AioRpcError as err:
            code: grpc.StatusCode = err.code()
            log.warning("usage shipment of %d records failed: %s %s", len(rows), code.name, err.details())
            region_metrics.usage_ship_failed()
            return code
        return None

    async def _delivered(self, rows: Sequence[PendingUsage]) -> None:
        await self._store.mark_shipped([row.key for row in rows])
        self.outbox.shipped([row.usage for row in rows])
        self.delivered += len(rows)

    async def _run(self) -> None:
        backoff = self._min_backoff_s
        while True:
            # Cleared before looking, so a row recorded while a batch ships is not left to the poll.
            self._wakeup.clear()
            self._announced = 0
            self._batch_ready.clear()
            try:
                outcome = await self.ship_batch()
            except Exception:
                # A database hiccup must not end shipping for the life of the process.
                log.exception("usage shipping failed")
                outcome = Shipment.FAILED
            if outcome is Shipment.FAILED:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = self._min_backoff_s
            if outcome is Shipment.SHIPPED and self._last_batch >= self._batch_size:
                continue  # more is likely pending: no reason to wait
            # Polling too: rows may come from another process sharing the store.
            if await wait_event(self._wakeup, self._idle_poll_s):
                await wait_event(self._batch_ready, self._linger_s)
