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
tenant and model (or one it accepted, when the continuation carries no
token: the caller lost the region before anything reached it; the region
that took the turn can then no longer start it), carrying no more tokens than that turn could produce;
the prompt that turn reserved is what the continuation's prompt already
counted. A turn has one continuation at a time (``continued_by``): a later
one, which the edge sends when the continuing region fails too, takes its
place only while it carries at least as many tokens (what the client has
can only grow), at most ``MAX_CONTINUATIONS`` per turn; the one it
replaces can no longer start (:func:`mark_started`), so two regions never
both stream the turn. A replayed older continuation is ALREADY_EXISTS.

A turn of its own that carries its tenant's quota (:class:`QuotaCheck`)
is accepted only while the tenant's month, counted zone-wide, is not used
up: billing's total, the usage rows of the zone billing had not counted
when asked, and the turns running in any region of the zone (each at its
prompt plus ``max_tokens``, as reserved: a turn accepted in the last
``ACCEPTED_WINDOW`` that has not streamed, or started in the last
``RUNNING_WINDOW`` with no usage row yet). The check and the acceptance are
one transaction, serialized per tenant (PostgreSQL: an advisory lock;
SQLite: one writer; CockroachDB: serializable, retried), so concurrent turns
in several regions cannot each see room the others take: the month ends at
most one admitted turn's reservation past the quota.

Every function runs inside the caller's transaction.
"""

from __future__ import annotations

import zlib
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Reason,
    ResourceExhausted,
)
from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.rows import AcceptedTurn, QuotaCheck, TurnStart

_T = schema.turn_starts
_O = schema.usage_outbox

ACCEPTED = "accepted"
STARTED = "started"

ACCEPTED_WINDOW = timedelta(minutes=10)
"""How long an accepted turn that has not streamed counts as running (queued,
prefilling); one that never starts (refused, its pod lost) stops counting then."""
MAX_CONTINUATIONS = 8
"""The most continuations one turn may have: more than the regions of any
zone, with a retry of a stalled one; a bound on what one turn can run."""
RUNNING_WINDOW = timedelta(hours=1)
"""How long a started turn without a usage row counts as running: one whose
region died mid-turn and that nobody continued stops counting then."""


# The statements every turn runs, built once: building a statement and its
# cache key on each call costs more than SQLite takes to run it.
_RECORDED = sa.select(_O.c.request_id).where(
    _O.c.tenant_id == sa.bindparam("b_tenant"), _O.c.request_id == sa.bindparam("b_request")
)
_START_OWN = (
    sa.update(_T)
    .where(
        _T.c.tenant_id == sa.bindparam("b_tenant"),
        _T.c.request_id == sa.bindparam("b_request"),
        _T.c.holder == sa.bindparam("b_holder"),
        _T.c.state == ACCEPTED,
        _T.c.continues.is_(None),
    )
    .values(state=STARTED)
)


def accept_turn(conn: Connection, start: TurnStart, region: str, now: datetime) -> AcceptedTurn:
    """Take ``start.request_id`` of ``start.tenant_id`` for ``start``'s turn in region ``region``."""
    recorded = conn.execute(_RECORDED, {"b_tenant": start.tenant_id, "b_request": start.request_id}).first()
    if recorded is not None:
        raise duplicate_request(start.request_id)
    accepted = AcceptedTurn()
    if start.continues is not None:
        accepted = _check_continuation(conn, start)
    elif start.quota is not None:
        _check_quota(conn, start, start.quota, now)
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
        _link(conn, start)
    return accepted


def _check_quota(conn: Connection, start: TurnStart, quota: QuotaCheck, now: datetime) -> None:
    """QUOTA_EXCEEDED when the tenant's month, counted zone-wide, is used up (see the module's note)."""
    tenant = start.tenant_id
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(zlib.crc32(f"quota:{tenant}".encode()))))
    recorded = [_O.c.tenant_id == tenant, _O.c.created_at >= quota.month_start]
    if quota.billed_at is not None:
        recorded.append(sa.or_(_O.c.shipped_at.is_(None), _O.c.shipped_at > quota.billed_at))
    unbilled = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(_O.c.tokens), 0)).where(*recorded))
    has_usage = (
        sa.select(_O.c.request_id)
        .where(_O.c.tenant_id == _T.c.tenant_id, _O.c.request_id == _T.c.request_id)
        .exists()
    )
    running = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(_T.c.prompt_tokens + _T.c.max_output_tokens), 0)).where(
            _T.c.tenant_id == tenant,
            _T.c.continues.is_(None),
            _T.c.request_id != start.request_id,
            _T.c.created_at >= quota.month_start,
            sa.or_(
                sa.and_(_T.c.state == ACCEPTED, _T.c.created_at >= now - ACCEPTED_WINDOW),
                sa.and_(_T.c.state == STARTED, _T.c.created_at >= now - RUNNING_WINDOW),
            ),
            ~has_usage,
        )
    )
    used = quota.billed + int(unbilled.scalar_one()) + int(running.scalar_one())
    if used >= quota.limit:
        period = quota.month_start.strftime("%Y-%m")
        raise ResourceExhausted(
            Reason.QUOTA_EXCEEDED,
            f"tenant {tenant} has used {used} of its {quota.limit} tokens for {period} (turns running "
            "in every region of its zone included); the quota resets at the start of next month (UTC)",
            metadata={"quota": str(quota.limit), "used": str(used), "period": period},
        )


def mark_started(conn: Connection, tenant_id: str, request_id: str, holder: str) -> bool:
    """Note that the tenant's turn's first event is about to reach its caller;
    False when this acceptance no longer holds the id (another took it over),
    or, for a continuation, when a later continuation of the turn took its place."""
    # A turn of its own (the common case) in one statement.
    own = {"b_tenant": tenant_id, "b_request": request_id, "b_holder": holder}
    if conn.execute(_START_OWN, own).rowcount == 1:
        return True
    held = _still_accepted(tenant_id, request_id, holder)
    row = conn.execute(
        sa.select(_T.c.continues).where(_T.c.tenant_id == tenant_id, _T.c.request_id == request_id)
    ).first()
    if row is not None and row.continues is not None:
        linked = conn.execute(
            sa.select(_T.c.continued_by).where(_T.c.tenant_id == tenant_id, _T.c.request_id == row.continues)
        ).scalar_one_or_none()
        if linked != request_id:
            return False
    done = conn.execute(held.values(state=STARTED))
    return bool(done.rowcount == 1)


def _still_accepted(tenant_id: str, request_id: str, holder: str) -> sa.Update:
    """The update of the tenant's turn while ``holder`` holds it and it has not started."""
    return sa.update(_T).where(
        _T.c.tenant_id == tenant_id,
        _T.c.request_id == request_id,
        _T.c.holder == holder,
        _T.c.state == ACCEPTED,
    )


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
    if original.state != STARTED and start.carried_tokens == 0:
        # Its region took it and went silent before a token reached the caller
        # (which cannot tell whether it began): it goes on here from nothing,
        # and the region that took it can no longer start it.
        conn.execute(
            sa.update(_T)
            .where(_T.c.tenant_id == start.tenant_id, _T.c.request_id == original_id)
            .values(holder="continued")
        )
    elif original.state != STARTED:
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


def _link(conn: Connection, start: TurnStart) -> None:
    """Make ``start`` the continuation of its turn (see the module's note)."""
    tenant_id, original_id, request_id = start.tenant_id, start.continues, start.request_id
    assert original_id is not None
    current = conn.execute(
        sa.select(_T.c.continued_by).where(_T.c.tenant_id == tenant_id, _T.c.request_id == original_id)
    ).scalar_one_or_none()
    if current is not None and current != request_id:
        carried = conn.execute(
            sa.select(_T.c.carried_tokens).where(_T.c.tenant_id == tenant_id, _T.c.request_id == current)
        ).scalar_one_or_none()
        count = conn.execute(
            sa.select(sa.func.count()).where(_T.c.tenant_id == tenant_id, _T.c.continues == original_id)
        ).scalar_one()
        if carried is not None and start.carried_tokens < carried:
            raise _already_continued(original_id, f"by {current!r}, which carries {carried} tokens")
        if count > MAX_CONTINUATIONS:
            raise _already_continued(original_id, f"{MAX_CONTINUATIONS} times, the most a turn may be")
    # Compare-and-set: of two continuations racing for the turn, one links.
    linked = conn.execute(
        sa.update(_T)
        .where(
            _T.c.tenant_id == tenant_id,
            _T.c.request_id == original_id,
            _T.c.continued_by.is_(None) if current is None else _T.c.continued_by == current,
        )
        .values(continued_by=request_id)
    )
    if linked.rowcount != 1:
        raise _already_continued(original_id, "by another attempt at the same time")


def _already_continued(original_id: str, how: str) -> AlreadyExists:
    return AlreadyExists(
        Reason.DUPLICATE_REQUEST,
        f"turn {original_id!r} was already continued {how}",
        metadata={"param": "continuation.original_request_id", "request_id": original_id},
    )


def duplicate_request(request_id: str) -> AlreadyExists:
    return AlreadyExists(
        Reason.DUPLICATE_REQUEST,
        f"request id {request_id!r} was already used",
        metadata={"request_id": request_id},
    )
