"""Settling a turn to what its client received.

A turn whose stream broke, and that no region of the zone could continue,
ends for its client with an error after some output; one that was
continued ends whole, but a region it left may have generated on. Its
regions' usage rows may bill more than the client received (a region cut
off from its edge, or only slow, generates on until it notices, and a
continuation that replaced it bills what the rows before it leave of its
own count), or less (a region that died mid-turn records nothing). The
edge, which knows what it delivered, settles the turn
(:func:`settle_turn`): the turn's rows, its original request id's and its
continuations', then bill exactly the delivered output, and every request
id of the turn holds a row, so a region recording the turn later adds
nothing (its write is a no-op, the id being taken).

- No row yet: one is written under the original request id, the turn's
  prompt (as its acceptance reserved it) and the delivered output.
- Rows that bill more: the unshipped ones are reduced, the latest
  attempt's first. A row billing already took is not changed (billing
  keeps no negative records); what it holds beyond the delivered output is
  reported as over-billed. So is a row shipped while the settlement runs.
- Rows that bill less, with a continuation not recorded (its region died,
  or its record waits in the region's spool): the latest such
  continuation's row bills the rest, as output of the original's request.

Runs inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import InvalidArgument, NotFound, Reason
from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.region.zone_store import schema

_T = schema.turn_starts
_O = schema.usage_outbox


class UsageCodec(Protocol):
    """Reads and writes the serialized ``UsageRecord`` of a usage row."""

    def output_of(self, usage: bytes) -> int:
        """The output tokens the record bills."""

    def with_output(self, usage: bytes, output_tokens: int) -> bytes:
        """The record billing ``output_tokens`` instead."""

    def new_row(
        self, request_id: str, model: str, input_tokens: int, output_tokens: int, continues: str = ""
    ) -> bytes:
        """A record of the turn's request ``request_id`` billing those tokens;
        with ``continues``, a continuation's share of the turn whose original
        request id that is (tokens, not a request of its own)."""


@dataclass(frozen=True)
class Settlement:
    """How a settled turn is billed."""

    billed_output_tokens: int
    over_billed_output_tokens: int
    """Output tokens rows billing already took hold beyond the delivered output."""


def settle_turn(
    conn: Connection,
    tenant_id: str,
    request_id: str,
    delivered: int,
    region: str,
    now: datetime,
    codec: UsageCodec,
) -> Settlement:
    """Bill the tenant's turn ``request_id`` (its original request id)
    ``delivered`` output tokens across its rows (see the module docstring);
    rows written here are ``region``'s to ship."""
    start = conn.execute(
        sa.select(_T.c.model, _T.c.prompt_tokens, _T.c.continues).where(
            _T.c.tenant_id == tenant_id, _T.c.request_id == request_id
        )
    ).first()
    if start is None:
        raise NotFound(
            Reason.REQUEST_NOT_FOUND,
            f"no turn {request_id!r} of this tenant to settle",
            metadata={"param": "request_id", "request_id": request_id},
        )
    if start.continues is not None:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{request_id!r} is a continuation of {start.continues!r}; settle the turn by its original id",
            metadata={"param": "request_id"},
        )
    attempts = conn.execute(
        sa.select(_T.c.request_id)
        .where(_T.c.tenant_id == tenant_id, _T.c.continues == request_id)
        .order_by(_T.c.created_at, _T.c.request_id)
    ).scalars()
    ids = [request_id, *attempts]
    rows = {
        row.request_id: row
        for row in conn.execute(
            sa.select(_O.c.request_id, _O.c.usage, _O.c.tokens, _O.c.shipped_at).where(
                _O.c.tenant_id == tenant_id, _O.c.request_id.in_(ids)
            )
        )
    }

    def new_row(
        rid: str, input_tokens: int, output: int, shipped_at: datetime | None, continues: str = ""
    ) -> dict[str, Any]:
        return {
            "request_id": rid,
            "tenant_id": tenant_id,
            "home_region": region,
            "usage": codec.new_row(rid, start.model, input_tokens, output, continues),
            "tokens": input_tokens + output,
            "created_at": now,
            "attempts": 0,
            "shipped_at": shipped_at,
        }

    billed = over = 0
    unrecorded = [rid for rid in ids[1:] if rid not in rows]
    if request_id not in rows:
        # Nothing recorded (its region died): the turn is one request, its prompt and what was delivered.
        insert_new_rows(conn, _O, [new_row(request_id, int(start.prompt_tokens), delivered, None)])
        billed = delivered
    else:
        outputs = {rid: codec.output_of(bytes(row.usage)) for rid, row in rows.items()}
        billed = sum(outputs.values())
        excess = billed - delivered
        for rid in reversed(ids):
            row = rows.get(rid)
            if excess <= 0 or row is None or row.shipped_at is not None or outputs[rid] == 0:
                continue
            cut = min(excess, outputs[rid])
            changed = conn.execute(
                sa.update(_O)
                .where(_O.c.tenant_id == tenant_id, _O.c.request_id == rid, _O.c.shipped_at.is_(None))
                .values(
                    usage=codec.with_output(bytes(row.usage), outputs[rid] - cut),
                    tokens=row.tokens - cut,
                )
            )
            if changed.rowcount == 1:
                excess -= cut
                billed -= cut
        over = max(0, excess)
        if billed < delivered and unrecorded:
            # A continuation that recorded nothing streamed the rest.
            latest = unrecorded.pop()
            insert_new_rows(conn, _O, [new_row(latest, 0, delivered - billed, None, request_id)])
            billed = delivered
    # Every attempt holds a row, so none recorded later bills anything; these are never shipped.
    placeholders = [new_row(rid, 0, 0, now) for rid in unrecorded]
    if placeholders:
        insert_new_rows(conn, _O, placeholders)
    return Settlement(billed, over)
