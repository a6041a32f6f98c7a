"""Conversation lifecycle in a region: deleted conversations are purged after
their tenant's retention (a manual clock; SQLite file and PostgreSQL), and a
turn whose record the zone store refused for a moment is written once it
is back, with one usage row (a running in-process mesh)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llmmesh.core.grpcserver import open_channel
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.lifecycle.purge import ConversationPurge
from llmmesh.region.lifecycle.retry import RecordRetries
from llmmesh.region.lifecycle.spool import RecordSpool, SpooledTurn, usage_rows
from llmmesh.region.zone_store import AssistantMessage, Role, ToolCallRow, ZoneStore
from llmmesh.region.zone_store import schema as zs
from llmmesh.region.zone_store.rows import ContinuedTurn
from llmmesh.v1 import (
    billing_service_pb2,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    policy_service_pb2,
)
from tests.stack import DEV_KEY, running_stack

pytestmark = pytest.mark.asyncio

SHORT, DEFAULT = "tenant-short", "tenant-default"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class Policies:
    """Two tenants: one keeps deleted conversations 2 days, one the region's default."""

    def __init__(self) -> None:
        self._tenants = {
            SHORT: policy_service_pb2.Tenant(id=SHORT, conversation_retention_days=2),
            DEFAULT: policy_service_pb2.Tenant(id=DEFAULT),
        }

    def tenants(self) -> list[policy_service_pb2.Tenant]:
        return list(self._tenants.values())

    def tenant(self, tenant_id: str) -> policy_service_pb2.Tenant | None:
        return self._tenants.get(tenant_id)


@pytest.fixture(params=["file", pytest.param("postgresql", marks=pytest.mark.services)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"sqlite:///{tmp_path / 'eu.db'}"
    found: str = request.getfixturevalue("postgres_schema_url")
    return found


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(url: str, clock: Clock) -> Iterator[ZoneStore]:
    opened = ZoneStore(create_store_engine(url), "eu", "eu-west", clock=clock)
    opened.create_schema()
    yield opened
    opened.dispose()


def rows(store: ZoneStore, table: sa.Table, conversation_id: str) -> int:
    column = table.c.id if table is zs.conversations else table.c.conversation_id
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(table).where(column == conversation_id)
            ).scalar_one()
        )


async def conversation_with_a_turn(store: ZoneStore, tenant: str, rid: str) -> str:
    conv = await store.create_conversation(tenant, "m")
    reply = AssistantMessage("an answer", "m", "FINISH_REASON_STOP", 3, 2)
    await store.record_turn(tenant, conv.id, rid, "a question", reply, b"usage", 5)
    return conv.id


async def test_deleted_conversations_are_purged_after_their_tenants_retention(
    store: ZoneStore, clock: Clock
) -> None:
    purge = ConversationPurge(store, Policies(), clock, default_days=30, batch=2)
    short = [await conversation_with_a_turn(store, SHORT, f"s{n}") for n in range(3)]
    default = await conversation_with_a_turn(store, DEFAULT, "d0")
    live = await conversation_with_a_turn(store, SHORT, "live")
    for cid in short:
        await store.soft_delete_conversation(SHORT, cid)
    await store.soft_delete_conversation(DEFAULT, default)

    clock.now += timedelta(days=1)
    assert await purge.sweep() == 0
    clock.now += timedelta(days=1, seconds=1)
    # Three due in batches of two; the default tenant's is kept for 30 days.
    assert await purge.sweep() == 3
    for cid in short:
        assert (rows(store, zs.conversations, cid), rows(store, zs.messages, cid)) == (0, 0)
    assert rows(store, zs.messages, default) == 2 and rows(store, zs.messages, live) == 2
    # Usage is not content: every turn's row stays for billing.
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(zs.usage_outbox)).scalar_one() == 5
    clock.now += timedelta(days=28)
    assert await purge.sweep() == 1
    assert rows(store, zs.conversations, default) == 0
    assert rows(store, zs.conversations, live) == 1
    assert await purge.sweep() == 0


async def test_a_record_the_store_refused_for_a_moment_is_written_once() -> None:
    async with running_stack() as stack:
        store = stack.region.store
        assert stack.region.lifecycle.retries is not None
        failures: list[str] = []

        def hook(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
            # The store is down for the turn's first two writes of its record.
            if "INSERT INTO usage_outbox" in statement and len(failures) < 2:
                failures.append(statement)
                raise sqlite3.OperationalError("disk I/O error")
            return False

        sa.event.listen(store.engine, "do_execute", hook)
        try:
            async with open_channel(stack.region.address) as channel:
                chat = chat_service_pb2_grpc.ChatServiceStub(channel)
                me = (("authorization", f"Bearer {DEV_KEY}"),)
                conv = (
                    await chat.CreateConversation(chat_service_pb2.CreateConversationRequest(), metadata=me)
                ).conversation
                call = chat.Chat(metadata=me)
                start = chat_service_pb2.ChatStart(
                    request_id="req-store-down",
                    model="auto",
                    conversation_id=conv.id,
                    messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Still there?")],
                    sampling=common_pb2.SamplingParams(max_tokens=5),
                )
                await call.write(chat_service_pb2.ChatRequest(start=start))
                await call.done_writing()
                events = [event async for event in call]
                # The stream ends normally; the message id is unknown while the record waits.
                assert events[-1].HasField("finished") and events[-1].finished.message_id == ""
                assert any(e.HasField("usage") for e in events)
                for _ in range(100):
                    listed = await chat.ListMessages(
                        chat_service_pb2.ListMessagesRequest(conversation_id=conv.id), metadata=me
                    )
                    if listed.messages:
                        break
                    await asyncio.sleep(0.1)
                assert [m.role for m in listed.messages] == [
                    common_pb2.CHAT_ROLE_USER,
                    common_pb2.CHAT_ROLE_ASSISTANT,
                ]
        finally:
            sa.event.remove(store.engine, "do_execute", hook)
        assert len(failures) == 2
        with store.engine.connect() as conn:
            query = (
                sa.select(sa.func.count())
                .select_from(zs.usage_outbox)
                .where(zs.usage_outbox.c.request_id == "req-store-down")
            )
            assert conn.execute(query).scalar_one() == 1


async def test_retries_stop_at_their_bound_and_a_drain_names_what_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[int] = []

    async def down() -> None:
        attempts.append(1)
        raise OSError("store down")

    retries = RecordRetries(first_delay_s=0.001, max_delay_s=0.002, max_attempts=3)
    assert await retries.keep("turn-a", down) is False
    assert len(attempts) == 3 and retries.pending == 0
    never = asyncio.Event()

    async def hangs() -> None:
        await never.wait()

    retries.keep("turn-b", hangs)
    assert retries.pending == 1
    await retries.drain(0.01)
    assert retries.pending == 0
    assert "turn-b" in caplog.text


def spooled_turn(request_id: str, conversation_id: str | None) -> SpooledTurn:
    reply = AssistantMessage(
        "über 42",
        "m",
        "FINISH_REASON_TOOL_CALLS",
        7,
        3,
        2,
        Decimal("0.000000123456789"),
        (ToolCallRow("call_1", "lookup", '{"q": "x"}'),),
    )
    return SpooledTurn(
        "tenant-a", conversation_id, request_id, "a question", reply, b"\x00usage\xff", 10, (), None
    )


async def test_a_spooled_turn_reads_back_as_written(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path / "spool" / "eu-west.pending-turns.jsonl")
    one, two = spooled_turn("r1", "conv_x"), spooled_turn("r2", None)
    spool.add(one)
    spool.add(two)
    spool.add(one)  # added twice (a retry after a crash): read once
    with spool.path.open("a") as cut:
        cut.write('{"tenant_id": "tenant-a", "request')  # a line cut short by a crash
    assert spool.load() == [one, two]
    spool.remove(one)
    assert spool.load() == [two]
    spool.remove(two)
    assert not spool.path.exists()


async def left_in_the_spool_then_resumed(store: ZoneStore, turn: SpooledTurn, tmp_path: Path) -> None:
    """``turn``'s record kept while the store is down until the region
    stops, so it is left in the spool; then the next start writes it, once,
    and empties the spool."""
    spool = RecordSpool(tmp_path / "eu-west.pending-turns.jsonl")

    async def down() -> None:
        raise OSError("store down")

    first = RecordRetries(first_delay_s=0.001, max_delay_s=0.002, spool=spool)
    first.keep(turn.request_id, down, turn)
    for _ in range(200):
        if spool.path.exists():
            break
        await asyncio.sleep(0.005)
    await first.drain(0.02)
    assert spool.load() == [turn]

    second = RecordRetries(first_delay_s=0.001, spool=RecordSpool(spool.path))
    assert second.resume(store) == 1
    for _ in range(200):
        if not spool.path.exists():
            break
        await asyncio.sleep(0.01)
    assert not spool.path.exists()


async def test_a_record_left_in_the_spool_is_written_by_the_next_start(
    store: ZoneStore, tmp_path: Path
) -> None:
    conv = await store.create_conversation("tenant-a", "m")
    turn = spooled_turn("r-crash", conv.id)
    await left_in_the_spool_then_resumed(store, turn, tmp_path)
    stored = await store.messages("tenant-a", conv.id)
    assert [(m.role, m.content) for m in stored] == [(Role.USER, "a question"), (Role.ASSISTANT, "über 42")]
    assert stored[1].tool_calls == turn.assistant.tool_calls and stored[1].cost_usd == turn.assistant.cost_usd
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(zs.usage_outbox.c.usage).where(zs.usage_outbox.c.request_id == "r-crash")
        ).all()
    assert [bytes(r.usage) for r in rows] == [b"\x00usage\xff"]


def usage_template(request_id: str, cached: int) -> bytes:
    return billing_service_pb2.UsageRecord(
        request_id=request_id,
        tenant_id="tenant-a",
        model="m",
        region="eu-west",
        usage=common_pb2.TokenUsage(input_tokens=7, output_tokens=3, cached_input_tokens=cached),
        end_user="user-9",
    ).SerializeToString()


def spooled_continuation(request_id: str, conversation_id: str | None) -> SpooledTurn:
    plain = spooled_turn(request_id, conversation_id)
    return dataclasses.replace(
        plain,
        usage=usage_template(request_id, cached=5),
        continued=ContinuedTurn("r-original", 7, 4, "über"),
        output_tokens=3,
    )


async def test_a_spooled_continuation_reads_back_and_an_older_line_still_reads(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path / "eu-west.pending-turns.jsonl")
    continuation, plain = spooled_continuation("r-cont", "conv_x"), spooled_turn("r-plain", None)
    spool.add(continuation)
    # A line written before continuations were spooled has neither field.
    older = json.loads(plain.to_json())
    del older["continued"], older["output_tokens"]
    with spool.path.open("a") as lines:
        lines.write(json.dumps(older) + "\n")
    assert spool.load() == [continuation, plain]


async def test_a_continuation_left_in_the_spool_is_written_by_the_next_start(
    store: ZoneStore, tmp_path: Path
) -> None:
    conv = await store.create_conversation("tenant-a", "m")
    turn = spooled_continuation("r-cont", conv.id)
    await left_in_the_spool_then_resumed(store, turn, tmp_path)
    # The original region recorded nothing: the original request id bills the
    # whole turn (its prompt, and the 4 tokens it delivered plus these 3), one
    # request; the continuation's own row has nothing to ship.
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(zs.usage_outbox.c.request_id, zs.usage_outbox.c.usage, zs.usage_outbox.c.shipped_at)
        ).all()
    by_id = {r.request_id: r for r in rows}
    assert set(by_id) == {"r-original", "r-cont"}
    original = billing_service_pb2.UsageRecord.FromString(bytes(by_id["r-original"].usage))
    assert (original.request_id, original.usage.input_tokens, original.usage.output_tokens) == (
        "r-original",
        7,
        7,
    )
    assert original.usage.cached_input_tokens == 5 and original.end_user == "user-9"
    assert original.region == "eu-west" and not original.continues_request_id
    assert by_id["r-cont"].shipped_at is not None
    stored = await store.messages("tenant-a", conv.id)
    assert [(m.role, m.content) for m in stored] == [(Role.USER, "a question"), (Role.ASSISTANT, "über 42")]


async def test_usage_rows_keep_the_template_but_for_the_rows_own_figures() -> None:
    encode = usage_rows(usage_template("r-1", cached=5))
    row = billing_service_pb2.UsageRecord.FromString(encode("r-2", 3, 9, "r-1"))
    assert (row.request_id, row.continues_request_id, row.model, row.end_user) == (
        "r-2",
        "r-1",
        "m",
        "user-9",
    )
    # Cached input is capped at the row's input.
    assert (row.usage.input_tokens, row.usage.output_tokens, row.usage.cached_input_tokens) == (3, 9, 3)
