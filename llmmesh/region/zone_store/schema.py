"""The zone store's tables: conversation content, which lives only in its zone.

Every row carries ``home_region``, the region that homes it: a conversation's
messages share the conversation's, a usage row has the region that ran the
turn. In a multi-region CockroachDB each row's ``crdb_region`` is computed
from it (see :mod:`region.zone_store.ddl`).
"""

from __future__ import annotations

import sqlalchemy as sa

from llmmesh.core.sqlstore import ExactDecimal, UtcDateTime

metadata = sa.MetaData()

conversations = sa.Table(
    "conversations",
    metadata,
    # A ConversationId string: it names the zone and home region.
    sa.Column("id", sa.String(96), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("zone", sa.String(16), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("title", sa.String(256), nullable=False),
    # Put before every turn's history; empty for none.
    sa.Column("system_prompt", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    # Soft delete: the row hides from every read; the purge removes its content later.
    sa.Column("deleted_at", UtcDateTime, nullable=True),
    # Listing is newest first per tenant.
    sa.Index("ix_conversations_tenant_created", "tenant_id", "created_at", "id"),
    # The purge finds soft-deleted conversations past their retention.
    sa.Index("ix_conversations_deleted", "deleted_at"),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("conversation_id", sa.String(96), sa.ForeignKey("conversations.id"), nullable=False),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    # The turn that wrote it.
    sa.Column("request_id", sa.String(128), nullable=True),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_input_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", ExactDecimal, nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("finish_reason", sa.String(32), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    # An assistant message's tool calls as a JSON array of {id, name,
    # arguments}; empty for none.
    sa.Column("tool_calls", sa.Text, nullable=False, server_default=""),
    # A tool message's: the call it answers; empty on other roles.
    sa.Column("tool_call_id", sa.String(64), nullable=False, server_default=""),
    # The message it follows: a conversation is a tree (edits and
    # regenerations branch it); empty for a first message.
    sa.Column("parent_id", sa.String(64), nullable=False, server_default=""),
    sa.UniqueConstraint("conversation_id", "seq", name="uq_messages_conversation_seq"),
    # One message per role and request id of a tenant (tool messages: per
    # call answered) makes a repeated turn a no-op (request ids are per tenant).
    sa.UniqueConstraint(
        "tenant_id", "request_id", "role", "tool_call_id", name="uq_messages_tenant_request_role_call"
    ),
)

usage_outbox = sa.Table(
    "usage_outbox",
    metadata,
    # Billing's idempotency key, (tenant, request id): a row is recorded
    # once and shipped until billing has it.
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("home_region", sa.String(64), nullable=False),
    # A serialized llmmesh.v1.UsageRecord.
    sa.Column("usage", sa.LargeBinary, nullable=False),
    # Its input plus output tokens, for month-to-date quota sums without decoding ``usage``.
    sa.Column("tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("shipped_at", UtcDateTime, nullable=True),
    sa.Index("ix_usage_outbox_pending", "shipped_at", "attempts", "created_at"),
    sa.Index("ix_usage_outbox_tenant_created", "tenant_id", "created_at"),
)

turn_starts = sa.Table(
    "turn_starts",
    metadata,
    # One row per request id a tenant ever had accepted in the zone: the
    # tenant's reuse of an id is refused before any engine work. Each
    # tenant's ids are its own, so no tenant can take another's.
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("request_id", sa.String(128), primary_key=True),
    # The region running the turn now (a takeover moves it).
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    # What the turn reserved: its prompt and the most output it may produce.
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("max_output_tokens", sa.BigInteger, nullable=False),
    # "accepted" until the first event reaches the caller, then "started":
    # only an accepted turn, which has streamed nothing, may be taken over.
    sa.Column("state", sa.String(16), nullable=False),
    # Which acceptance holds the row; a takeover changes it.
    sa.Column("holder", sa.String(64), nullable=False),
    # A continuation: the original turn's request id (of the same tenant) and the tokens it carried.
    sa.Column("continues", sa.String(128), nullable=True),
    sa.Column("carried_tokens", sa.BigInteger, nullable=False),
    # The attempt that continues this one, if any: a turn's attempts form one chain.
    sa.Column("continued_by", sa.String(128), nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_turn_starts_tenant_continues", "tenant_id", "continues"),
)

summaries = sa.Table(
    "conversation_summaries",
    metadata,
    # One summary per branch point summarised: the last message it covers.
    sa.Column("conversation_id", sa.String(96), sa.ForeignKey("conversations.id"), primary_key=True),
    sa.Column("through_message_id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    # How many whole turns of the branch, from its first message, it replaces.
    sa.Column("turns", sa.Integer, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    # The model that wrote it.
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

zone_keys = sa.Table(
    "zone_keys",
    metadata,
    # One secret per zone and purpose ("end_user_pseudonym"), made by the
    # first region of the zone that needed it and read by every other; it
    # never leaves the zone store.
    sa.Column("zone", sa.String(16), primary_key=True),
    sa.Column("purpose", sa.String(32), primary_key=True),
    # The region that made it: the row is homed in the zone like any other.
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("secret", sa.LargeBinary, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

ZONE_TABLES = (conversations, messages, usage_outbox, turn_starts, summaries, zone_keys)
"""Homed row by row: ``REGIONAL BY ROW`` in a multi-region CockroachDB."""
