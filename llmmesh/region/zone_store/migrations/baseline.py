"""A zone store's tables at revision 0001, the first with migrations.

Frozen here: later revisions change the tables with operations of their own
and never through this module; :mod:`llmmesh.region.zone_store.schema` is
the current shape.
"""

from __future__ import annotations

import sqlalchemy as sa

from llmmesh.core.sqlstore import ExactDecimal, UtcDateTime

tables = sa.MetaData()

conversations = sa.Table(
    "conversations",
    tables,
    sa.Column("id", sa.String(length=96), nullable=False),
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("zone", sa.String(length=16), nullable=False),
    sa.Column("home_region", sa.String(length=64), nullable=False),
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("title", sa.String(length=256), nullable=False),
    sa.Column("system_prompt", sa.Text(), server_default="", nullable=False),
    sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    sa.Column("updated_at", UtcDateTime(timezone=True), nullable=False),
    sa.Column("deleted_at", UtcDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("id"),
)

sa.Index("ix_conversations_deleted", conversations.c.deleted_at)
sa.Index(
    "ix_conversations_tenant_created",
    conversations.c.tenant_id,
    conversations.c.created_at,
    conversations.c.id,
)
turn_starts = sa.Table(
    "turn_starts",
    tables,
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("request_id", sa.String(length=128), nullable=False),
    sa.Column("home_region", sa.String(length=64), nullable=False),
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("max_output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("state", sa.String(length=16), nullable=False),
    sa.Column("holder", sa.String(length=64), nullable=False),
    sa.Column("continues", sa.String(length=128), nullable=True),
    sa.Column("carried_tokens", sa.BigInteger(), nullable=False),
    sa.Column("continued_by", sa.String(length=128), nullable=True),
    sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("tenant_id", "request_id"),
)

sa.Index("ix_turn_starts_tenant_continues", turn_starts.c.tenant_id, turn_starts.c.continues)
usage_outbox = sa.Table(
    "usage_outbox",
    tables,
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("request_id", sa.String(length=128), nullable=False),
    sa.Column("home_region", sa.String(length=64), nullable=False),
    sa.Column("usage", sa.LargeBinary(), nullable=False),
    sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
    sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("shipped_at", UtcDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("tenant_id", "request_id"),
)

sa.Index(
    "ix_usage_outbox_pending", usage_outbox.c.shipped_at, usage_outbox.c.attempts, usage_outbox.c.created_at
)
sa.Index("ix_usage_outbox_tenant_created", usage_outbox.c.tenant_id, usage_outbox.c.created_at)
conversation_summaries = sa.Table(
    "conversation_summaries",
    tables,
    sa.Column("conversation_id", sa.String(length=96), nullable=False),
    sa.Column("through_message_id", sa.String(length=64), nullable=False),
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("home_region", sa.String(length=64), nullable=False),
    sa.Column("turns", sa.Integer(), nullable=False),
    sa.Column("content", sa.Text(), nullable=False),
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(
        ["conversation_id"],
        ["conversations.id"],
    ),
    sa.PrimaryKeyConstraint("conversation_id", "through_message_id"),
)

messages = sa.Table(
    "messages",
    tables,
    sa.Column("id", sa.String(length=64), nullable=False),
    sa.Column("conversation_id", sa.String(length=96), nullable=False),
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("home_region", sa.String(length=64), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("role", sa.String(length=16), nullable=False),
    sa.Column("content", sa.Text(), nullable=False),
    sa.Column("request_id", sa.String(length=128), nullable=True),
    sa.Column("input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cost_usd", ExactDecimal(), nullable=False),
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("finish_reason", sa.String(length=32), nullable=False),
    sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    sa.Column("tool_calls", sa.Text(), server_default="", nullable=False),
    sa.Column("tool_call_id", sa.String(length=64), server_default="", nullable=False),
    sa.Column("parent_id", sa.String(length=64), server_default="", nullable=False),
    sa.ForeignKeyConstraint(
        ["conversation_id"],
        ["conversations.id"],
    ),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("conversation_id", "seq", name="uq_messages_conversation_seq"),
    sa.UniqueConstraint(
        "tenant_id", "request_id", "role", "tool_call_id", name="uq_messages_tenant_request_role_call"
    ),
)
