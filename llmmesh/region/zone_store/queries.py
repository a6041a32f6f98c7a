"""The statements behind :class:`region.zone_store.ZoneStore`: appending messages and reading rows back.

Every function runs inside the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.ids import new_id
from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.rows import (
    AssistantMessage,
    ConversationRow,
    MessageRow,
    Role,
    ToolCallRow,
    ToolResult,
)
from llmmesh.region.zone_store.turn_starts import attempts_of, duplicate_request

_C = schema.conversations
_M = schema.messages
_O = schema.usage_outbox


def append_message(
    conn: Connection,
    conversation: ConversationRow,
    role: Role,
    content: str,
    request_id: str | None,
    now: datetime,
    reply: AssistantMessage | None = None,
    tool_call_id: str = "",
    parent_id: str | None = None,
) -> MessageRow:
    """Add a message numbered after the conversation's last one (a tool
    message names the call it answers in ``tool_call_id``), following
    ``parent_id`` in the conversation's tree ("" for a first message; None:
    the newest message, which continues the current branch).

    The caller holds the conversation's row lock (or SQLite's single write
    lock), so no other transaction can take the same ``seq`` meanwhile.
    """
    last = conn.execute(
        sa.select(_M.c.seq, _M.c.id)
        .where(_M.c.conversation_id == conversation.id)
        .order_by(_M.c.seq.desc())
        .limit(1)
    ).first()
    if parent_id is None:
        parent_id = "" if last is None else str(last.id)
    message = MessageRow(
        id=new_id("msg"),
        conversation_id=conversation.id,
        seq=(0 if last is None else int(last.seq)) + 1,
        role=role,
        content=content,
        request_id=request_id,
        input_tokens=reply.input_tokens if reply else 0,
        output_tokens=reply.output_tokens if reply else 0,
        cached_input_tokens=reply.cached_input_tokens if reply else 0,
        cost_usd=reply.cost_usd if reply else Decimal(0),
        model=reply.model if reply else "",
        finish_reason=reply.finish_reason if reply else "",
        created_at=now,
        tool_calls=reply.tool_calls if reply else (),
        tool_call_id=tool_call_id,
        parent_id=parent_id,
    )
    values = asdict(message) | {
        "role": str(role),
        "tenant_id": conversation.tenant_id,
        "tool_calls": tool_calls_json(message.tool_calls),
    }
    conn.execute(sa.insert(_M).values(**values, home_region=conversation.home_region))
    return message


def append_tool_results(
    conn: Connection,
    conversation: ConversationRow,
    request_id: str,
    results: Sequence[ToolResult],
    now: datetime,
    parent_id: str | None = None,
) -> list[MessageRow]:
    """The turn's tool messages, each stored once under ``request_id`` (one
    stored before, by an earlier attempt of the turn, is kept), the first
    following ``parent_id`` (as :func:`append_message` takes it) and each
    other the one before; ALREADY_EXISTS when the request stored them in
    another conversation."""
    stored: list[MessageRow] = []
    for result in results:
        existing = message_of_request(
            conn, conversation.tenant_id, request_id, Role.TOOL, result.tool_call_id
        )
        if existing is not None and existing.conversation_id != conversation.id:
            raise duplicate_request(request_id)
        stored.append(
            existing
            or append_message(
                conn,
                conversation,
                Role.TOOL,
                result.content,
                request_id,
                now,
                None,
                result.tool_call_id,
                parent_id,
            )
        )
        parent_id = stored[-1].id
    return stored


def store_turn_messages(
    conn: Connection,
    conversation: ConversationRow,
    request_id: str,
    user_message: str | None,
    reply: AssistantMessage,
    tool_results: Sequence[ToolResult],
    parent_id: str | None,
    now: datetime,
) -> list[MessageRow]:
    """A turn's messages under ``request_id``, in the tree's order: its tool
    messages, its user message (``user_message``; one the request stored
    before is kept), then ``reply``, which completes in place a partial
    reply the request stored before (a failed-over turn's). The first new
    message follows ``parent_id`` (as :func:`append_message` takes it), each
    other the one before it. ALREADY_EXISTS when the request stored them in
    another conversation."""
    tenant_id = conversation.tenant_id
    stored = append_tool_results(conn, conversation, request_id, tool_results, now, parent_id)
    parent = stored[-1].id if stored else parent_id
    asked = message_of_request(conn, tenant_id, request_id, Role.USER)
    if asked is not None and asked.conversation_id != conversation.id:
        raise duplicate_request(request_id)
    if asked is None and user_message is not None:
        asked = append_message(conn, conversation, Role.USER, user_message, request_id, now, parent_id=parent)
    if asked is not None:
        stored.append(asked)
        parent = asked.id
    partial = message_of_request(conn, tenant_id, request_id, Role.ASSISTANT)
    if partial is None:
        stored.append(
            append_message(
                conn, conversation, Role.ASSISTANT, reply.content, request_id, now, reply, parent_id=parent
            )
        )
    elif partial.conversation_id != conversation.id:
        raise duplicate_request(request_id)
    else:
        replace_reply(conn, partial.id, reply)
        stored.append(message_of_request(conn, tenant_id, request_id, Role.ASSISTANT) or partial)
    touch(conn, conversation.id, now)
    return stored


def replace_reply(conn: Connection, message_id: str, reply: AssistantMessage) -> None:
    """Make a stored assistant message the whole reply (a continuation completes a partial one)."""
    conn.execute(
        sa.update(_M)
        .where(_M.c.id == message_id)
        .values(
            content=reply.content,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cached_input_tokens=reply.cached_input_tokens,
            cost_usd=reply.cost_usd,
            model=reply.model,
            finish_reason=reply.finish_reason,
            tool_calls=tool_calls_json(reply.tool_calls),
        )
    )


def turn_tokens(conn: Connection, tenant_id: str, original_request_id: str, but: str) -> int:
    """Tokens already recorded for a turn, by its original request id and the
    continuations the zone accepted for it, leaving out request id ``but``."""
    attempts = _O.c.request_id.in_(attempts_of(tenant_id, original_request_id))
    query = sa.select(sa.func.coalesce(sa.func.sum(_O.c.tokens), 0)).where(
        _O.c.tenant_id == tenant_id,
        sa.or_(_O.c.request_id == original_request_id, attempts),
        _O.c.request_id != but,
    )
    return int(conn.execute(query).scalar_one())


def touch(conn: Connection, conversation_id: str, now: datetime) -> None:
    """Note that the conversation changed."""
    conn.execute(sa.update(_C).where(_C.c.id == conversation_id).values(updated_at=now))


def message_of_request(
    conn: Connection, tenant_id: str, request_id: str, role: Role, tool_call_id: str = ""
) -> MessageRow | None:
    """The message of ``role`` the tenant's request wrote (for a tool
    message, the one answering ``tool_call_id``), in whatever conversation
    (unique per tenant, request, role and call answered)."""
    query = sa.select(_M).where(
        _M.c.tenant_id == tenant_id,
        _M.c.request_id == request_id,
        _M.c.role == str(role),
        _M.c.tool_call_id == tool_call_id,
    )
    row = conn.execute(query).first()
    return None if row is None else message_of(row)


def messages_of_request(conn: Connection, tenant_id: str, request_id: str) -> tuple[MessageRow, ...]:
    """Every message the tenant's request wrote, in order."""
    query = (
        sa.select(_M)
        .where(_M.c.tenant_id == tenant_id, _M.c.request_id == request_id)
        .order_by(_M.c.conversation_id, _M.c.seq)
    )
    return tuple(message_of(row) for row in conn.execute(query))


def conversation_of(row: sa.Row[Any]) -> ConversationRow:
    return ConversationRow(
        row.id,
        row.tenant_id,
        row.zone,
        row.home_region,
        row.model,
        row.title,
        row.created_at,
        row.updated_at,
        row.system_prompt,
    )


def message_of(row: sa.Row[Any]) -> MessageRow:
    return MessageRow(
        id=row.id,
        conversation_id=row.conversation_id,
        seq=row.seq,
        role=Role(row.role),
        content=row.content,
        request_id=row.request_id,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cached_input_tokens=row.cached_input_tokens,
        cost_usd=row.cost_usd,
        model=row.model,
        finish_reason=row.finish_reason,
        created_at=row.created_at,
        tool_calls=tool_calls_of(row.tool_calls),
        tool_call_id=row.tool_call_id,
        parent_id=row.parent_id,
    )


def tool_calls_json(calls: tuple[ToolCallRow, ...]) -> str:
    """Tool calls as the ``tool_calls`` column holds them ("" for none)."""
    return json.dumps([asdict(call) for call in calls], ensure_ascii=False) if calls else ""


def tool_calls_of(text: str) -> tuple[ToolCallRow, ...]:
    """The ``tool_calls`` column read back."""
    return tuple(ToolCallRow(c["id"], c["name"], c["arguments"]) for c in json.loads(text)) if text else ()
