"""The usage ledger: idempotent ingestion of metered turns, exact costs, monthly totals.

Holds token counts and costs keyed by request id; never prompt or output text.
"""

from __future__ import annotations

import asyncio
import decimal
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from globalplane.clock import Clock, utc_now
from globalplane.model_catalog import Model, ModelCatalog
from globalplane.tenant_book import TenantBook
from llmmesh.errors import InvalidArgument, Reason

_PERIOD = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
# Token counts are int64 and prices short decimals: 60 digits keep every
# product and sum exact, where the default 28 could round.
_EXACT = decimal.Context(prec=60)


@dataclass(frozen=True)
class UsageRecord:
    """The metered usage of one turn, as a region ships it."""

    request_id: str
    tenant_id: str
    model: str
    region: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    end_time: datetime | None = None
    """When the turn ended (aware); ``None`` means when it is ingested."""


@dataclass(frozen=True)
class IngestOutcome:
    """How many records were stored now and how many were already known."""

    accepted: int
    duplicates: int


@dataclass(frozen=True)
class UsageTotals:
    """A tenant's usage in one calendar month (UTC)."""

    period: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    requests: int = 0

    def plus(self, input_tokens: int, output_tokens: int, cost: Decimal) -> UsageTotals:
        return UsageTotals(
            self.period,
            self.input_tokens + input_tokens,
            self.output_tokens + output_tokens,
            _EXACT.add(self.cost_usd, cost),
            self.requests + 1,
        )


def turn_cost(model: Model, input_tokens: int, output_tokens: int) -> Decimal:
    """Exact USD cost: tokens x price per 1,000, input and output priced apart."""
    input_cost = _EXACT.multiply(Decimal(input_tokens), model.input_per_1k_usd).scaleb(-3, _EXACT)
    output_cost = _EXACT.multiply(Decimal(output_tokens), model.output_per_1k_usd).scaleb(-3, _EXACT)
    return _EXACT.add(input_cost, output_cost)


def format_usd(amount: Decimal) -> str:
    """``amount`` as a plain decimal string without exponent or trailing zeros."""
    return format(_EXACT.normalize(amount), "f") if amount else "0"


def period_of(moment: datetime) -> str:
    """The calendar month (UTC) of an aware datetime, "YYYY-MM"."""
    return moment.astimezone(UTC).strftime("%Y-%m")


def require_period(period: str) -> str:
    """``period`` if it is "YYYY-MM"; INVALID_ARGUMENT otherwise."""
    if not _PERIOD.match(period):
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"period must be 'YYYY-MM', got {period!r}", metadata={"param": "period"}
        )
    return period


class UsageLedger:
    """Billed turns keyed by request id, and per-tenant monthly totals.

    Ingestion is idempotent: a request id is billed once however often it
    arrives, concurrently or not. Prices are those of the model at
    ingestion time.
    """

    def __init__(self, tenants: TenantBook, catalog: ModelCatalog, clock: Clock = utc_now) -> None:
        self._tenants = tenants
        self._catalog = catalog
        self._clock = clock
        self._billed: set[str] = set()
        self._totals: dict[tuple[str, str], UsageTotals] = {}
        # Validation awaits the tenant book and catalog; the lock keeps the
        # check-then-insert of a request id atomic across those awaits.
        self._lock = asyncio.Lock()

    async def record(self, records: Sequence[UsageRecord]) -> IngestOutcome:
        """Ingest ``records`` all or nothing.

        INVALID_ARGUMENT for an empty request id or a negative count,
        NOT_FOUND for an unknown tenant or model; then nothing is stored,
        so the region can fix and resend the batch.
        """
        async with self._lock:
            priced = [(record, *await self._validate(record)) for record in records]
            accepted = duplicates = 0
            for record, tenant_id, model in priced:
                if record.request_id in self._billed:
                    duplicates += 1
                    continue
                self._billed.add(record.request_id)
                period = period_of(record.end_time or self._clock())
                key = (tenant_id, period)
                totals = self._totals.get(key, UsageTotals(period))
                cost = turn_cost(model, record.input_tokens, record.output_tokens)
                self._totals[key] = totals.plus(record.input_tokens, record.output_tokens, cost)
                accepted += 1
            return IngestOutcome(accepted, duplicates)

    async def usage(self, tenant_id: str, period: str = "") -> UsageTotals:
        """A tenant's totals for ``period`` ("YYYY-MM", UTC; empty for the current month)."""
        period = require_period(period) if period else period_of(self._clock())
        tenant = await self._tenants.get_tenant(tenant_id)
        return self._totals.get((tenant.id, period), UsageTotals(period))

    async def reconcile(self, request_ids: Iterable[str]) -> list[str]:
        """The ids among ``request_ids`` never ingested, in order, each once."""
        async with self._lock:
            missing = (rid for rid in request_ids if rid not in self._billed)
            return list(dict.fromkeys(missing))

    async def _validate(self, record: UsageRecord) -> tuple[str, Model]:
        """The record's tenant id and model, or the error that rejects the batch."""
        if not record.request_id:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "usage record without request_id", metadata={"param": "request_id"}
            )
        for field in ("input_tokens", "output_tokens", "cached_input_tokens"):
            if getattr(record, field) < 0:
                raise InvalidArgument(
                    Reason.INVALID_REQUEST,
                    f"{field} must be >= 0 (request {record.request_id})",
                    metadata={"param": f"usage.{field}", "request_id": record.request_id},
                )
        tenant = await self._tenants.get_tenant(record.tenant_id)
        return tenant.id, await self._catalog.get_model(record.model)
