"""The usage ledger: idempotent ingestion of metered turns, exact costs, monthly totals.

Backed by the global store. Holds token counts and costs keyed by tenant
and request id; never prompt or output text. A batch is ingested in one
transaction that inserts the new records (the (request id, tenant) primary
key makes a repeat a no-op, whichever process or coroutine delivers it, and
keeps one tenant's ids from hiding another's turns) and adds them to the
monthly totals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core import pricing
from llmmesh.core.end_user import require_end_user_pseudonym
from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.usage_purpose import PURPOSES, TURN
from llmmesh.globalplane import schema
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.model_catalog import Model, find_model
from llmmesh.globalplane.policy_rows import find_tenant
from llmmesh.globalplane.store import GlobalStore, insert_new_rows

_PERIOD = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


# Token counts are int64 and prices short decimals: 60 digits keep every
# product and sum exact, where the default 28 could round.
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
    continues_request_id: str = ""
    """The failed-over turn whose request this record's tokens belong to; it is not a request of its own."""
    end_user: str = ""
    """The pseudonym of the end user the turn served (OpenAI's ``user``), as
    its zone computed it (:func:`llmmesh.core.end_user.end_user_pseudonym`);
    empty if none was named. The raw id never leaves the zone."""
    purpose: str = TURN
    """What its tokens were spent on, one of :data:`llmmesh.core.usage_purpose.PURPOSES`:
    a background record adds tokens and cost, not a request."""


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

    def plus(self, other: UsageTotals) -> UsageTotals:
        """These totals and ``other``'s, of the same period, added exactly."""
        return UsageTotals(
            self.period,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            pricing.EXACT.add(self.cost_usd, other.cost_usd),
            self.requests + other.requests,
        )


def turn_cost(model: Model, input_tokens: int, output_tokens: int) -> Decimal:
    """Exact USD cost of a turn at the model's prices."""
    return pricing.turn_cost(model.input_per_1k_usd, model.output_per_1k_usd, input_tokens, output_tokens)


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


_RECONCILE_CHUNK = 500


class UsageLedger:
    """Billed turns keyed by request id, and per-tenant monthly totals.

    Ingestion is idempotent: a request id is billed once however often it
    arrives, concurrently or not, from one process or several. Prices are
    those of the model at ingestion time.
    """

    def __init__(self, store: GlobalStore, clock: Clock = utc_now) -> None:
        self._store = store
        self._clock = clock

    async def record(self, records: Sequence[UsageRecord]) -> IngestOutcome:
        """Ingest ``records`` all or nothing, in one transaction.

        INVALID_ARGUMENT for an empty request id, a negative count or an
        end user that is no pseudonym, NOT_FOUND for an unknown tenant or model; then nothing is stored,
        so the region can fix and resend the batch. Within a batch, the
        first record of a request id counts and later ones are duplicates.
        """
        for record in records:
            _check_shape(record)
        now = self._clock()

        def ingest(conn: Connection) -> IngestOutcome:
            rows: dict[tuple[str, str], dict[str, Any]] = {}
            tenant_ids: dict[str, str] = {}
            models: dict[str, Model] = {}
            for record in records:
                if record.tenant_id not in tenant_ids:
                    tenant_ids[record.tenant_id] = find_tenant(conn, record.tenant_id).id
                if record.model not in models:
                    models[record.model] = find_model(conn, record.model)
                row = _usage_row(record, tenant_ids[record.tenant_id], models[record.model], now)
                rows.setdefault((record.request_id, row["tenant_id"]), row)
            inserted = [rows[key] for key in insert_new_rows(conn, schema.usage_records, list(rows.values()))]
            _add_to_totals(conn, inserted)
            return IngestOutcome(len(inserted), len(records) - len(inserted))

        return await self._store.transaction(ingest)

    async def usage(self, tenant_id: str, period: str = "", end_user: str = "") -> UsageTotals:
        """A tenant's totals for ``period`` ("YYYY-MM", UTC; empty for the
        current month); with ``end_user``, an end user's pseudonym, those of
        the turns made for that end user only (INVALID_ARGUMENT
        ``END_USER_NOT_PSEUDONYMOUS`` for anything but a pseudonym)."""
        period = require_period(period) if period else period_of(self._clock())
        require_end_user_pseudonym(end_user, "end_user")

        def read(conn: Connection) -> UsageTotals:
            tenant = find_tenant(conn, tenant_id)
            if end_user:
                return _end_user_totals(conn, tenant.id, period, end_user)
            u = schema.usage_totals
            row = conn.execute(sa.select(u).where(u.c.tenant_id == tenant.id, u.c.period == period)).first()
            return _totals_of(row) if row is not None else UsageTotals(period)

        return await self._store.transaction(read)

    async def usage_by_model(
        self, tenant_id: str, period: str = "", end_user: str = ""
    ) -> dict[tuple[str, str], UsageTotals]:
        """:meth:`usage` split by model and purpose (:mod:`globalplane.usage_by_model`)."""
        from llmmesh.globalplane.usage_by_model import model_totals  # it builds on this module's types

        period = require_period(period) if period else period_of(self._clock())
        require_end_user_pseudonym(end_user, "end_user")
        return await self._store.transaction(
            lambda conn: model_totals(conn, find_tenant(conn, tenant_id).id, period, end_user)
        )

    async def reconcile(self, request_ids: Iterable[str], tenant_id: str = "") -> list[str]:
        """The ids among ``request_ids`` never ingested (for ``tenant_id``,
        when given; for any tenant otherwise), in order, each once."""
        wanted = list(dict.fromkeys(request_ids))

        def known(conn: Connection) -> set[str]:
            r = schema.usage_records
            found: set[str] = set()
            for start in range(0, len(wanted), _RECONCILE_CHUNK):
                chunk = wanted[start : start + _RECONCILE_CHUNK]
                query = sa.select(r.c.request_id).where(r.c.request_id.in_(chunk))
                if tenant_id:
                    query = query.where(r.c.tenant_id == find_tenant(conn, tenant_id).id)
                found.update(conn.execute(query).scalars())
            return found

        billed = await self._store.transaction(known)
        return [rid for rid in wanted if rid not in billed]


def _check_shape(record: UsageRecord) -> None:
    """The error that rejects the batch for a malformed ``record``, if any."""
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
    require_end_user_pseudonym(record.end_user, "end_user")
    if record.purpose not in PURPOSES:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"purpose must be one of {', '.join(PURPOSES)}, got {record.purpose!r}"
            f" (request {record.request_id})",
            metadata={"param": "purpose", "request_id": record.request_id},
        )


def counts_request(continues_request_id: str | None, purpose: str) -> bool:
    """Whether a record is a request of its own: neither a continuation's
    tokens nor background work."""
    return not continues_request_id and purpose == TURN


def _usage_row(record: UsageRecord, tenant_id: str, model: Model, now: datetime) -> dict[str, Any]:
    return {
        "request_id": record.request_id,
        "tenant_id": tenant_id,
        "model": model.name,
        "region": record.region,
        "period": period_of(record.end_time or now),
        "input_tokens": record.input_tokens,
        "output_tokens": record.output_tokens,
        "cached_input_tokens": record.cached_input_tokens,
        "cost_usd": turn_cost(model, record.input_tokens, record.output_tokens),
        "end_time": record.end_time,
        "ingest_time": now,
        "continues_request_id": record.continues_request_id or None,
        "end_user": record.end_user or None,
        "purpose": record.purpose,
    }


def _end_user_totals(conn: Connection, tenant_id: str, period: str, end_user: str) -> UsageTotals:
    """One end user's totals, summed from the tenant's records of the
    period (the monthly totals are per tenant only); costs are added here,
    exactly, as SQLite cannot add decimals."""
    r = schema.usage_records
    rows = conn.execute(
        sa.select(
            r.c.input_tokens, r.c.output_tokens, r.c.cost_usd, r.c.continues_request_id, r.c.purpose
        ).where(r.c.tenant_id == tenant_id, r.c.end_user == end_user, r.c.period == period)
    )
    totals = UsageTotals(period)
    for row in rows:
        requests = 1 if counts_request(row.continues_request_id, row.purpose) else 0
        totals = totals.plus(UsageTotals(period, row.input_tokens, row.output_tokens, row.cost_usd, requests))
    return totals


def _totals_of(row: sa.Row[Any]) -> UsageTotals:
    return UsageTotals(row.period, row.input_tokens, row.output_tokens, row.cost_usd, row.requests)


def _add_to_totals(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Add newly inserted usage rows to their tenant's monthly totals.

    The totals row is created if missing, then locked and rewritten with
    the exact sum computed here: SQLite cannot add decimals exactly, and
    locking rows in key order keeps concurrent batches from deadlocking.
    """
    added: dict[tuple[str, str], UsageTotals] = {}
    for row in rows:
        key = (row["tenant_id"], row["period"])
        requests = 1 if counts_request(row["continues_request_id"], row["purpose"]) else 0
        turn = UsageTotals(
            row["period"], row["input_tokens"], row["output_tokens"], row["cost_usd"], requests
        )
        added[key] = added.get(key, UsageTotals(row["period"])).plus(turn)
    u = schema.usage_totals
    zero = {"input_tokens": 0, "output_tokens": 0, "requests": 0, "cost_usd": Decimal(0)}
    insert_new_rows(conn, u, [{"tenant_id": t, "period": p, **zero} for t, p in added])
    for (tenant_id, period), more in sorted(added.items()):
        where = (u.c.tenant_id == tenant_id, u.c.period == period)
        current = _totals_of(conn.execute(sa.select(u).where(*where).with_for_update()).one())
        total = current.plus(more)
        conn.execute(
            sa.update(u)
            .where(*where)
            .values(
                input_tokens=total.input_tokens,
                output_tokens=total.output_tokens,
                requests=total.requests,
                cost_usd=total.cost_usd,
            )
        )
