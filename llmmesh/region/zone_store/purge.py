"""Purging soft-deleted conversations, and every conversation of a deleted
tenant: their messages, summaries and rows leave the zone store for good.

Usage rows and turn markers are not content (counts and ids, which billing
and idempotency need) and stay. Every function runs inside the caller's
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.region.zone_store import schema

_C = schema.conversations
_M = schema.messages
_S = schema.summaries


@dataclass(frozen=True)
class DeletedConversation:
    """A soft-deleted conversation awaiting its purge."""

    id: str
    tenant_id: str
    deleted_at: datetime


def deleted_page(
    conn: Connection, home_region: str, before: datetime, after: tuple[datetime, str] | None, limit: int
) -> list[DeletedConversation]:
    """Up to ``limit`` conversations homed in ``home_region`` deleted before
    ``before``, oldest deletion first, after keyset position ``after``."""
    query = sa.select(_C.c.id, _C.c.tenant_id, _C.c.deleted_at).where(
        _C.c.deleted_at.is_not(None), _C.c.deleted_at < before, _C.c.home_region == home_region
    )
    if after is not None:
        moment, last_id = after
        query = query.where(
            sa.or_(_C.c.deleted_at > moment, sa.and_(_C.c.deleted_at == moment, _C.c.id > last_id))
        )
    query = query.order_by(_C.c.deleted_at, _C.c.id).limit(limit)
    return [DeletedConversation(row.id, row.tenant_id, row.deleted_at) for row in conn.execute(query)]


def purge(conn: Connection, conversation_id: str, deleted_before: datetime) -> bool:
    """Remove a conversation deleted before ``deleted_before`` and its content;
    False when it is not (any more) such a conversation."""
    gone = conn.execute(
        sa.select(_C.c.id)
        .where(_C.c.id == conversation_id, _C.c.deleted_at.is_not(None), _C.c.deleted_at < deleted_before)
        .with_for_update()
    ).first()
    if gone is None:
        return False
    conn.execute(sa.delete(_S).where(_S.c.conversation_id == conversation_id))
    conn.execute(sa.delete(_M).where(_M.c.conversation_id == conversation_id))
    conn.execute(sa.delete(_C).where(_C.c.id == conversation_id))
    return True


def purge_tenant(conn: Connection, tenant_id: str) -> int:
    """Remove every conversation of ``tenant_id`` (deleted or not) with its
    messages and summaries; how many rows went."""
    removed = 0
    for table in (_S, _M, _C):
        removed += conn.execute(sa.delete(table).where(table.c.tenant_id == tenant_id)).rowcount
    return int(removed)
