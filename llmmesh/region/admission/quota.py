"""Per-tenant monthly token quotas (``Tenant.monthly_token_quota``).

A tenant's month-to-date usage, as a gateway sees it, is the sum of:

- billing's total for the month (``BillingService.GetUsage``), read at most
  every ``refresh_s`` per tenant;
- the tokens of the tenant's turns in the zone store that billing had not
  received when that total was read (unshipped rows, and rows shipped since),
  recorded by any region of the zone, since they share the zone store;
- the tokens this gateway has reserved for the tenant's turns still running
  (prompt plus ``max_tokens``, as for the TPM limit).

A turn is refused with ``RESOURCE_EXHAUSTED`` (``QUOTA_EXCEEDED``) once that
sum reaches the quota. That check is this region's; a chat turn is checked
again as the zone store accepts it, against the turns running in every
region of the zone (:meth:`QuotaLedger.zone_check`), so regions of a zone
cannot each admit the room the others take. The sum may count a row twice for a moment (shipped
between the read and billing's answer), never zero times, so the quota errs
towards refusing; the overrun past the quota is at most what the turns
already admitted then generate. While billing cannot be reached the last
total is kept; with none read yet this month, every row of the month in the
zone store counts instead (all the zone knows).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, ResourceExhausted
from llmmesh.region.policy_cache import Caller
from llmmesh.region.zone_store import QuotaCheck, ZoneStore
from llmmesh.v1 import billing_service_pb2, billing_service_pb2_grpc

log = logging.getLogger(__name__)


def month_start(now: datetime) -> datetime:
    """The first instant of ``now``'s calendar month, UTC."""
    now = now.astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_of(now: datetime) -> str:
    """Billing's name of ``now``'s month: ``YYYY-MM``."""
    return now.astimezone(UTC).strftime("%Y-%m")


@dataclass
class _Billed:
    """Billing's month total of one tenant and when it was asked for."""

    period: str
    tokens: int
    asked_at: datetime


@dataclass
class QuotaHold:
    """Tokens held for one running turn until :meth:`QuotaLedger.release`."""

    tenant_id: str
    tokens: int
    released: bool = False


class QuotaLedger:
    """Checks turns against their tenant's monthly token quota."""

    def __init__(
        self,
        billing: billing_service_pb2_grpc.BillingServiceStub,
        store: ZoneStore,
        refresh_s: float = 30.0,
        *,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._billing = billing
        self._store = store
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._billed: dict[str, _Billed] = {}
        self._reading: dict[str, asyncio.Future[None]] = {}
        self._held: dict[str, int] = {}
        # When billing was last asked per tenant, answered or not: an
        # unreachable global plane is asked once per refresh, not per turn.
        self._attempted: dict[str, float] = {}
        self._refreshing: set[asyncio.Task[None]] = set()

    async def used(self, tenant_id: str) -> int:
        """The tenant's month-to-date tokens, running turns included."""
        now = self._wall_clock()
        billed = await self._billed_total(tenant_id, now)
        if billed is None:
            local = await self._store.tenant_tokens(tenant_id, month_start(now))
            return local + self._held.get(tenant_id, 0)
        local = await self._store.tenant_tokens(tenant_id, month_start(now), shipped_after=billed.asked_at)
        return billed.tokens + local + self._held.get(tenant_id, 0)

    async def zone_check(self, caller: Caller) -> QuotaCheck | None:
        """What the zone store checks a turn of ``caller`` against as it
        accepts it, counting the turns of every region of the zone
        (:mod:`region.zone_store.turn_starts`); None for a tenant without a quota."""
        quota = caller.tenant.monthly_token_quota
        if quota <= 0:
            return None
        now = self._wall_clock()
        billed = await self._billed_total(caller.tenant.id, now)
        if billed is None:
            return QuotaCheck(quota, month_start(now))
        return QuotaCheck(quota, month_start(now), billed.tokens, billed.asked_at)

    async def hold(self, caller: Caller, tokens: int) -> QuotaHold:
        """Admit a turn that may use up to ``tokens`` and hold them until it
        ends; QUOTA_EXCEEDED when the tenant's month is used up."""
        tenant = caller.tenant
        hold = QuotaHold(tenant.id, tokens)
        quota = tenant.monthly_token_quota
        if quota <= 0:
            hold.released = True  # nothing to give back
            return hold
        used = await self.used(tenant.id)
        if used >= quota:
            period = period_of(self._wall_clock())
            raise ResourceExhausted(
                Reason.QUOTA_EXCEEDED,
                f"tenant {tenant.id} has used {used} of its {quota} tokens for {period}; "
                "the quota resets at the start of next month (UTC)",
                metadata={"quota": str(quota), "used": str(used), "period": period},
            )
        self._held[tenant.id] = self._held.get(tenant.id, 0) + tokens
        return hold

    def release(self, hold: QuotaHold) -> None:
        """The turn ended (its usage is in the zone store now, or never will be)."""
        if hold.released:
            return
        hold.released = True
        left = self._held.get(hold.tenant_id, 0) - hold.tokens
        if left > 0:
            self._held[hold.tenant_id] = left
        else:
            self._held.pop(hold.tenant_id, None)

    async def _billed_total(self, tenant_id: str, now: datetime) -> _Billed | None:
        period = period_of(now)
        attempted = self._attempted.get(tenant_id)
        if attempted is not None and self._clock() - attempted < self._refresh_s:
            billed = self._billed.get(tenant_id)
            return billed if billed is not None and billed.period == period else None
        known = self._billed.get(tenant_id)
        if known is not None and known.period == period:
            # Refresh in the background and answer with the last total (rows
            # shipped since are counted locally): a slow or unreachable
            # billing service never holds up a turn that has a total to go on.
            if tenant_id not in self._reading:
                self._attempted[tenant_id] = self._clock()  # one refresh at a time
                task = asyncio.create_task(self._read_once(tenant_id, period))
                self._refreshing.add(task)
                task.add_done_callback(self._refreshing.discard)
            return known
        reading = self._reading.get(tenant_id)
        if reading is None:
            await self._read_once(tenant_id, period)
        else:
            await asyncio.shield(reading)
        billed = self._billed.get(tenant_id)
        return billed if billed is not None and billed.period == period else None

    async def _read_once(self, tenant_id: str, period: str) -> None:
        """One read of a tenant's billed total; concurrent askers share it."""
        reading: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading[tenant_id] = reading
        try:
            await self._read(tenant_id, period)
        finally:
            del self._reading[tenant_id]
            reading.set_result(None)

    async def _read(self, tenant_id: str, period: str) -> None:
        asked_at = self._wall_clock()
        self._attempted[tenant_id] = self._clock()
        try:
            response = await self._billing.GetUsage(
                billing_service_pb2.GetUsageRequest(tenant_id=tenant_id, period=period),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as err:
            # Keep the last total; rows shipped since are counted locally.
            log.warning("quota: billing usage of %s unavailable (%s)", tenant_id, err.code().name)
            return
        self._billed[tenant_id] = _Billed(period, response.input_tokens + response.output_tokens, asked_at)
