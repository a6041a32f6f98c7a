"""A zone store written by an earlier version, whose request ids were one
namespace across the zone's tenants, or which kept no tool calls and tool
messages, is upgraded in place when a region opens it: every row kept, and
from then on request ids are each tenant's own and a turn stores its tool
messages, one per call answered (SQLite file and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llmmesh.core.errors import AlreadyExists
from llmmesh.core.ids import ConversationId
from llmmesh.region.zone_store import (
    AssistantMessage,
    PendingUsage,
    Role,
    ToolCallRow,
    ToolResult,
    TurnStart,
    UsageKey,
    ZoneStore,
)
from llmmesh.region.zone_store import schema as zs
from llmmesh.region.zone_store.migrations.adopt import outdated_tables
from llmmesh.v1 import billing_service_pb2

pytestmark = pytest.mark.asyncio

A, B = "tenant-a", "tenant-b"
NOW = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)
REPLY = AssistantMessage("an answer", "m", "FINISH_REASON_STOP", 3, 2)


TOOL_COLUMNS = ("tool_calls", "tool_call_id")
ERAS = ["keyed by request id", "before markers", "before tool messages"]


def _columns(table: sa.Table, *key: str, leave_out: tuple[str, ...] = ()) -> list[sa.Column[Any]]:
    columns = []
    for c in table.columns:
        if c.name in leave_out:
            continue
        default = c.server_default.arg if c.server_default is not None else None  # type: ignore[attr-defined]
        foreign = [sa.ForeignKey(fk.target_fullname) for fk in c.foreign_keys]
        columns.append(
            sa.Column(
                c.name,
                c.type,
                *foreign,
                primary_key=c.name in key,
                nullable=c.nullable,
                server_default=default,
            )
        )
    return columns


def old_shape(era: str) -> sa.MetaData:
    """The zone tables as they were in ``era``: keyed by request id alone
    (and, "before markers", before ``turn_starts`` and the outbox's
    ``tokens`` existed), or keyed by tenant "before tool messages"; none
    with the messages' tool columns."""
    before_markers = era == "before markers"
    by_tenant = era == "before tool messages"
    key = ("tenant_id", "request_id") if by_tenant else ("request_id",)
    old = sa.MetaData()
    zs.conversations.to_metadata(old)
    sa.Table(
        "messages",
        old,
        *_columns(zs.messages, "id", leave_out=TOOL_COLUMNS),
        sa.UniqueConstraint("conversation_id", "seq", name="uq_messages_conversation_seq"),
        sa.UniqueConstraint(*key, "role", name=f"uq_messages_{'tenant_' if by_tenant else ''}request_role"),
    )
    sa.Table(
        "usage_outbox",
        old,
        *_columns(zs.usage_outbox, *key, leave_out=("tokens",) if before_markers else ()),
        sa.Index("ix_usage_outbox_pending", "shipped_at", "attempts", "created_at"),
        sa.Index("ix_usage_outbox_tenant_created", "tenant_id", "created_at"),
    )
    if not before_markers:
        sa.Table(
            "turn_starts",
            old,
            *_columns(zs.turn_starts, *key),
            sa.Index(
                *(
                    ("ix_turn_starts_tenant_continues", "tenant_id")
                    if by_tenant
                    else ("ix_turn_starts_continues",)
                ),
                "continues",
            ),
        )
    return old


def usage(request_id: str, tenant_id: str) -> bytes:
    return billing_service_pb2.UsageRecord(request_id=request_id, tenant_id=tenant_id).SerializeToString()


def write_old_store(url: str, era: str) -> str:
    """An old store holding tenant A's turn "req-1" (shipped) and "req-2" (pending); the conversation's id."""
    before_markers = era == "before markers"
    old = old_shape(era)
    conversation = str(ConversationId.new("us", "us-east"))
    engine = sa.create_engine(url)
    old.create_all(engine)
    t = old.tables
    outbox: dict[str, Any] = {"tenant_id": A, "home_region": "us-east", "created_at": NOW, "attempts": 0}
    if not before_markers:
        outbox["tokens"] = 5
    with engine.begin() as conn:
        conn.execute(
            sa.insert(t["conversations"]).values(
                id=conversation,
                tenant_id=A,
                zone="us",
                home_region="us-east",
                model="m",
                title="kept",
                created_at=NOW,
                updated_at=NOW,
            )
        )
        for seq, role in ((1, "user"), (2, "assistant")):
            conn.execute(
                sa.insert(t["messages"]).values(
                    id=f"msg-{seq}",
                    conversation_id=conversation,
                    tenant_id=A,
                    home_region="us-east",
                    seq=seq,
                    role=role,
                    content=f"{role} text",
                    request_id="req-1",
                    input_tokens=0,
                    output_tokens=0,
                    cached_input_tokens=0,
                    cost_usd=Decimal("0.000000123456789012345"),
                    model="m",
                    finish_reason="",
                    created_at=NOW,
                )
            )
        conn.execute(
            sa.insert(t["usage_outbox"]),
            [
                {**outbox, "request_id": "req-1", "usage": usage("req-1", A), "shipped_at": NOW},
                {**outbox, "request_id": "req-2", "usage": usage("req-2", A), "shipped_at": None},
            ],
        )
        if not before_markers:
            conn.execute(
                sa.insert(t["turn_starts"]).values(
                    request_id="req-1",
                    tenant_id=A,
                    home_region="us-east",
                    model="m",
                    prompt_tokens=3,
                    max_output_tokens=40,
                    state="started",
                    holder="h1",
                    continues=None,
                    carried_tokens=0,
                    continued_by=None,
                    created_at=NOW,
                )
            )
    engine.dispose()
    return conversation


def keys_of(store: ZoneStore) -> dict[str, set[str]]:
    inspector = sa.inspect(store.engine)
    keys = {
        t: set(inspector.get_pk_constraint(t)["constrained_columns"]) for t in ("usage_outbox", "turn_starts")
    }
    keys["messages"] = set().union(
        *(
            set(u["column_names"])
            for u in inspector.get_unique_constraints("messages")
            if "role" in u["column_names"]
        )
    )
    return keys


async def upgrade_and_use(url: str, era: str) -> None:
    before_markers = era == "before markers"
    conversation = write_old_store(url, era)
    store = await ZoneStore.open(url, "us", "us-east")
    try:
        assert keys_of(store) == {
            "usage_outbox": {"tenant_id", "request_id"},
            "turn_starts": {"tenant_id", "request_id"},
            "messages": {"tenant_id", "request_id", "role", "tool_call_id"},
        }
        with store.engine.connect() as conn:
            assert outdated_tables(conn) == []
            outbox = conn.execute(
                sa.select(zs.usage_outbox.c.request_id, zs.usage_outbox.c.shipped_at).order_by("request_id")
            ).all()
        assert [(r.request_id, r.shipped_at is not None) for r in outbox] == [
            ("req-1", True),
            ("req-2", False),
        ]
        assert [(m.seq, m.content, m.request_id) for m in await store.messages(A, conversation)] == [
            (1, "user text", "req-1"),
            (2, "assistant text", "req-1"),
        ]
        assert (await store.messages(A, conversation))[0].cost_usd == Decimal("0.000000123456789012345")
        assert await store.pending_usage() == [PendingUsage(A, "req-2", usage("req-2", A))]

        # Tenant A's ids stay taken; tenant B's "req-1" is a turn of its own, content and usage.
        for taken in ("req-1", "req-2"):
            with pytest.raises(AlreadyExists):
                await store.accept_turn(TurnStart(taken, A, "m", 3, 40, "h2"))
        await store.accept_turn(TurnStart("req-1", B, "m", 3, 40, "h3"))
        assert await store.mark_started(B, "req-1", "h3")
        theirs = await store.create_conversation(B, "m")
        turn = await store.record_turn(B, theirs.id, "req-1", "b asks", REPLY, usage("req-1", B), tokens=5)
        assert not turn.duplicate and len(turn.messages) == 2
        assert await store.mark_shipped([UsageKey(A, "req-2")]) == 1
        assert await store.pending_usage() == [PendingUsage(B, "req-1", usage("req-1", B))]
        assert await store.tenant_tokens(A, NOW) == (0 if before_markers else 10)

        # A reply with tool calls, then a turn answering both calls: two tool messages of one request.
        calls = (ToolCallRow("call_1", "get_weather", '{"city": "Oslo"}'), ToolCallRow("call_2", "now", "{}"))
        asked = AssistantMessage("", "m", "FINISH_REASON_TOOL_CALLS", 3, 9, tool_calls=calls)
        await store.record_turn(A, conversation, "req-3", "weather?", asked, usage("req-3", A), tokens=12)
        answers = (ToolResult("call_1", "12 C"), ToolResult("call_2", "noon"))
        await store.record_turn(A, conversation, "req-4", None, REPLY, usage("req-4", A), 5, answers)
        stored = (await store.messages(A, conversation))[2:]
        assert [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in stored] == [
            (Role.USER, "weather?", (), ""),
            (Role.ASSISTANT, "", calls, ""),
            (Role.TOOL, "12 C", (), "call_1"),
            (Role.TOOL, "noon", (), "call_2"),
            (Role.ASSISTANT, "an answer", (), ""),
        ]
    finally:
        store.dispose()
    # Opening the upgraded store again changes nothing.
    again = await ZoneStore.open(url, "us", "us-east")
    try:
        with again.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(zs.usage_outbox)).scalar_one() == 5
    finally:
        again.dispose()


@pytest.mark.parametrize("era", ERAS)
async def test_a_sqlite_zone_store_is_upgraded(tmp_path: Path, era: str) -> None:
    await upgrade_and_use(f"sqlite:///{tmp_path / 'zone-us.db'}", era)


@pytest.mark.services
@pytest.mark.parametrize("era", ERAS)
async def test_a_postgresql_zone_store_is_upgraded(postgres_schema_url: str, era: str) -> None:
    await upgrade_and_use(postgres_schema_url, era)
