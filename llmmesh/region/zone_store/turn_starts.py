"""The "started" marker of every turn a zone accepts (``turn_starts``),
written before any engine work: one per tenant and request id, across the
zone's regions.

Request ids are a namespace per tenant: another tenant's use of the same
id is a turn of its own, so no tenant can take, or learn of, ids another
tenant uses. A tenant's request id is taken once. The tenant reusing it,
while its turn runs or after it ended, is ALREADY_EXISTS
(``DUPLICATE_REQUEST``): a reused id never streams a turn that its usage
row would not bill. The one exception is a turn that streamed nothing yet
(state ``accepted``): its tenant may take it over, which is how a caller
retries a turn whose region failed before answering, and the first holder
then finds it lost the id (:func:`mark_started`) and stops before any
output.

A continuation is accepted only for a turn the zone started for the same
tenant and model, once per turn, carrying no more tokens than that turn
could produce; the prompt that turn reserved is what the continuation's
prompt already counted.

Every function runs inside the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Reason
from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.rows import AcceptedTurn, TurnStart

_T = schema.turn_starts
_O = schema.usage_outbox

ACCEPTED = "accepted"
STARTED = "started"


def accept_turn(conn: Connection, start: TurnStart, region: str, now: datetime) -> AcceptedTurn:
    """Take ``start.request_id`` of ``start.tenant_id`` for ``start``'s turn in region ``region``."""
    recorded = conn.execute(
        sa.select(_O.c.request_id).where(
            _O.c.tenant_id == start.tenant_id, _O.c.request_id == start.request_id
        )
    ).first()
    if recorded is not None:
        raise duplicate_request(start.request_id)
    accepted = AcceptedTurn()
    if start.continues is not None:
        accepted = _check_continuation(conn, start)
    row: dict[str, Any] = {
        "request_id": start.request_id,
        "tenant_id": start.tenant_id,
        "home_region": region,
        "model": start.model,
        "prompt_tokens": start.prompt_tokens,
        "max_output_tokens": start.max_output_tokens,
        "state": ACCEPTED,
        "holder": start.holder,
        "continues": start.continues,
        "carried_tokens": start.carried_tokens,
        "continued_by": None,
        "created_at": now,
    }
    if not insert_new_rows(conn, _T, [row]):
        _take_over(conn, start, region)
    if start.continues is not None:
        _link(conn, start.tenant_id, start.continues, start.request_id)
    return accepted


def mark_started(conn: Connection, tenant_id: str, request_id: str, holder: str) -> bool:
    """Note that the tenant's turn's first event is about to reach its caller;
    False when this acceptance no longer holds the id (another took it over)."""
    done = conn.execute(
        sa.update(_T)
        .where(
            _T.c.tenant_id == tenant_id,
            _T.c.request_id == request_id,
            _T.c.holder == holder,
            _T.c.state == ACCEPTED,
        )
        .values(state=STARTED)
    )
    return bool(done.rowcount == 1)


def attempts_of(tenant_id: str, original_request_id: str) -> sa.Select[tuple[str]]:
    """The request ids of the continuations accepted for the tenant's turn."""
    return sa.select(_T.c.request_id).where(
        _T.c.tenant_id == tenant_id, _T.c.continues == original_request_id
    )


def _check_continuation(conn: Connection, start: TurnStart) -> AcceptedTurn:
    original_id = start.continues
    assert original_id is not None
    # Only the tenant's own turns are looked at: another tenant's id is not this tenant's turn.
    original = conn.execute(
        sa.select(_T).where(_T.c.tenant_id == start.tenant_id, _T.c.request_id == original_id)
    ).first()
    if original is None:
        raise NotFound(
            Reason.REQUEST_NOT_FOUND,
            f"no turn {original_id!r} of this tenant to continue",
            metadata={"param": "continuation.original_request_id", "request_id": original_id},
        )
    if original.continues is not None:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{original_id!r} is a continuation; a continuation names its turn's original request id",
            metadata={"param": "continuation.original_request_id"},
        )
    if original.state != STARTED:
        raise FailedPrecondition(
            Reason.INVALID_REQUEST,
            f"turn {original_id!r} has streamed nothing: retry it under its own id, do not continue it",
            metadata={"param": "continuation.original_request_id"},
        )
    if original.model != start.model:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"turn {original_id!r} ran model {original.model!r}, not {start.model!r}",
            metadata={"param": "model"},
        )
    if start.carried_tokens > original.max_output_tokens:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"the continuation carries {start.carried_tokens} output tokens; turn {original_id!r} "
            f"could produce at most {original.max_output_tokens}",
            metadata={"param": "continuation.emitted_token_ids"},
        )
    return AcceptedTurn(int(original.prompt_tokens))


def _take_over(conn: Connection, start: TurnStart, region: str) -> None:
    """Take over the tenant's accepted turn that has streamed nothing; ALREADY_EXISTS otherwise."""
    taken = conn.execute(
        sa.update(_T)
        .where(
            _T.c.tenant_id == start.tenant_id,
            _T.c.request_id == start.request_id,
            _T.c.state == ACCEPTED,
            # A continuation stays one of the same turn.
            _T.c.continues.is_(None) if start.continues is None else _T.c.continues == start.continues,
        )
        .values(
            holder=start.holder,
            home_region=region,
            model=start.model,
            prompt_tokens=start.prompt_tokens,
            max_output_tokens=start.max_output_tokens,
            carried_tokens=start.carried_tokens,
        )
    )
    if taken.rowcount != 1:
        raise duplicate_request(start.request_id)


def _link(conn: Connection, tenant_id: str, original_id: str, request_id: str) -> None:
    """Make ``request_id`` the one continuation of the tenant's turn ``original_id``."""
    linked = conn.execute(
        sa.update(_T)
        .where(
            _T.c.tenant_id == tenant_id,
            _T.c.request_id == original_id,
            sa.or_(_T.c.continued_by.is_(None), _T.c.continued_by == request_id),
        )
        .values(continued_by=request_id)
    )
    if linked.rowcount != 1:
        raise AlreadyExists(
            Reason.DUPLICATE_REQUEST,
            f"turn {original_id!r} was already continued",
            metadata={"param": "continuation.original_request_id", "request_id": original_id},
        )


def duplicate_request(request_id: str) -> AlreadyExists:
    return AlreadyExists(
        Reason.DUPLICATE_REQUEST,
        f"request id {request_id!r} was already used",
        metadata={"request_id": request_id},
    )
