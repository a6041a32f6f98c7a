"""Stored summaries of conversation branches (``conversation_summaries``).

A summary covers a branch's first whole turns, through one message: every
branch passing through that message can use it. Like messages, summaries
are content and stay in the conversation's zone store, homed in its region.

Every function runs inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.rows import ConversationRow, SummaryRow

_S = schema.summaries
_CHUNK = 500  # message ids per IN (…)


def latest_summary(conn: Connection, conversation_id: str, path_ids: Sequence[str]) -> SummaryRow | None:
    """The summary covering the most turns among those through one of ``path_ids``."""
    best: SummaryRow | None = None
    for start in range(0, len(path_ids), _CHUNK):
        chunk = list(path_ids[start : start + _CHUNK])
        query = (
            sa.select(_S)
            .where(_S.c.conversation_id == conversation_id, _S.c.through_message_id.in_(chunk))
            .order_by(_S.c.turns.desc(), _S.c.created_at.desc())
            .limit(1)
        )
        row = conn.execute(query).first()
        if row is not None and (best is None or row.turns > best.turns):
            best = SummaryRow(
                row.conversation_id, row.through_message_id, row.turns, row.content, row.model, row.created_at
            )
    return best


def save_summary(conn: Connection, conversation: ConversationRow, summary: SummaryRow) -> bool:
    """Store ``summary`` unless one through the same message exists; whether it was stored."""
    values = asdict(summary) | {"tenant_id": conversation.tenant_id, "home_region": conversation.home_region}
    return bool(insert_new_rows(conn, _S, [values]))
