"""The zone store on embedded SQLite (in memory and in a file) and on real PostgreSQL.

Failures inside a transaction are injected at the driver (the engine's
``do_execute`` event), so the store's own code runs unchanged: the error
arrives exactly where a real one would.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llmmesh.core.errors import InvalidArgument, MeshError, NotFound, Reason
from llmmesh.core.ids import ConversationId
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.zone_store import (
    AssistantMessage,
    ConversationRow,
    PendingUsage,
    Role,
    UsageKey,
    ZoneStore,
)
from llmmesh.region.zone_store import schema as zs
from llmmesh.v1 import billing_service_pb2, common_pb2

pytestmark = pytest.mark.asyncio

A, B = "tenant-a", "tenant-b"
REPLY = AssistantMessage(
    content="The mesh routes by KV affinity.",
    model="m",
    finish_reason="FINISH_REASON_STOP",
    input_tokens=12,
    output_tokens=7,
    cached_input_tokens=4,
    cost_usd=Decimal("0.000000123456789012345"),
)


class StepClock:
    """Each reading is one second after the last (or the same, when frozen)."""

    def __init__(self) -> None:
        self.now = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)
        self.frozen = False

    def __call__(self) -> datetime:
        if not self.frozen:
            self.now += timedelta(seconds=1)
        return self.now


def usage(request_id: str, tenant_id: str = A) -> bytes:
    return billing_service_pb2.UsageRecord(
        request_id=request_id,
        tenant_id=tenant_id,
        model="m",
        region="eu-west",
        usage=common_pb2.TokenUsage(input_tokens=12, output_tokens=7),
    ).SerializeToString()


def open_store(url: str, clock: StepClock | None = None, region: str = "eu-west") -> ZoneStore:
    store = ZoneStore(create_store_engine(url), "eu", region, clock=clock or StepClock())
    store.create_schema()
    return store


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture(params=["memory", "file", pytest.param("postgresql", marks=pytest.mark.services)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "sqlite://"
    if request.param == "file":
        return f"sqlite:///{tmp_path / 'zone' / 'eu.db'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


@pytest.fixture
def store(store_url: str, clock: StepClock) -> Iterator[ZoneStore]:
    opened = open_store(store_url, clock)
    yield opened
    opened.dispose()


def count(store: ZoneStore, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


@contextlib.contextmanager
def failing_once(store: ZoneStore, prefix: str, fail: Callable[[Any], None]) -> Iterator[list[str]]:
    """Make the first statement starting with ``prefix`` fail through ``fail(cursor)``."""
    fired: list[str] = []

    def hook(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        if not fired and statement.lstrip().upper().startswith(prefix):
            fired.append(statement)
            fail(cursor)
        return False  # not handled: the driver runs the statement

    sa.event.listen(store.engine, "do_execute", hook)
    try:
        yield fired
    finally:
        sa.event.remove(store.engine, "do_execute", hook)


def serialization_failure(cursor: Any) -> None:
    """What a conflicting writer causes: SQLSTATE 40001 from PostgreSQL, "database is locked" from SQLite."""
    if isinstance(cursor, sqlite3.Cursor):
        raise sqlite3.OperationalError("database is locked")
    cursor.execute(
        "DO $$ BEGIN RAISE EXCEPTION 'injected conflict' USING ERRCODE = 'serialization_failure'; END $$"
    )


def crash(cursor: Any) -> None:
    raise RuntimeError("injected crash")


async def test_created_conversations_are_read_back_and_listed_newest_first(store: ZoneStore) -> None:
    first = await store.create_conversation(A, "m", "first")
    second = await store.create_conversation(A, "m")
    parsed = ConversationId.parse(first.id)
    assert parsed is not None and (parsed.zone, parsed.home_region) == ("eu", "eu-west")
    assert (first.zone, first.home_region, first.title, first.tenant_id) == ("eu", "eu-west", "first", A)
    assert await store.get_conversation(A, first.id) == first
    assert (await store.list_conversations(A)).items == [second, first]
    assert await store.messages(A, first.id) == []


async def test_pages_cover_every_conversation_once_even_with_equal_times_and_new_arrivals(
    store: ZoneStore, clock: StepClock
) -> None:
    made = [await store.create_conversation(A, "m", f"c{i}") for i in range(4)]
    clock.frozen = True  # equal creation times: the id breaks the tie
    made += [await store.create_conversation(A, "m", f"c{i}") for i in range(4, 7)]
    seen: list[ConversationRow] = []
    token = ""
    for _ in range(10):
        page = await store.list_conversations(A, page_size=3, page_token=token)
        assert len(page.items) <= 3
        seen += page.items
        if len(seen) == 3:
            clock.frozen = False
            await store.create_conversation(A, "m", "newer")  # before the first page: not served
        token = page.next_page_token
        if not token:
            break
    assert sorted(c.id for c in seen) == sorted(c.id for c in made)
    assert seen == sorted(seen, key=lambda c: (c.created_at, c.id), reverse=True)
    assert len((await store.list_conversations(A, page_size=500)).items) == 8


@pytest.mark.parametrize(("size", "token"), [(-1, ""), (2, "not base64!"), (2, "Zm9v")])
async def test_bad_page_requests_are_invalid(store: ZoneStore, size: int, token: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.list_conversations(A, page_size=size, page_token=token)
    assert info.value.metadata["param"] in ("page_size", "page_token")


async def test_a_soft_deleted_conversation_is_gone_from_every_read(store: ZoneStore) -> None:
    kept = await store.create_conversation(A, "m")
    gone = await store.create_conversation(A, "m")
    await store.record_turn(A, gone.id, "req-1", "hi", REPLY, usage("req-1"))
    await store.soft_delete_conversation(A, gone.id)
    for read in (store.get_conversation, store.messages, store.soft_delete_conversation):
        with pytest.raises(NotFound) as info:
            await read(A, gone.id)
        assert info.value.reason == Reason.CONVERSATION_NOT_FOUND
    with pytest.raises(NotFound):
        await store.append_user_message(A, gone.id, "more")
    assert (await store.list_conversations(A)).items == [kept]
    # A turn that ends after the delete is billed, and its content is not stored.
    late = await store.record_turn(A, gone.id, "req-2", "hi", REPLY, usage("req-2"))
    assert (late.duplicate, late.messages) == (False, ())
    assert count(store, zs.messages, zs.messages.c.request_id == "req-2") == 0
    assert [row.request_id for row in await store.pending_usage()] == ["req-1", "req-2"]


async def test_one_tenant_can_never_reach_anothers_conversation(store: ZoneStore) -> None:
    mine = await store.create_conversation(A, "m", "private")
    await store.record_turn(A, mine.id, "req-a", "secret question", REPLY, usage("req-a"))
    before = await store.messages(A, mine.id)
    missing = str(ConversationId.new("eu", "eu-west"))
    for attempt in (
        store.get_conversation(B, mine.id),
        store.messages(B, mine.id),
        store.append_user_message(B, mine.id, "injected"),
        store.soft_delete_conversation(B, mine.id),
    ):
        with pytest.raises(NotFound) as info:
            await attempt
        # Indistinguishable from a conversation that does not exist.
        with pytest.raises(NotFound) as absent:
            await store.get_conversation(B, missing)
        assert (info.value.code, info.value.reason) == (absent.value.code, absent.value.reason)
    assert (await store.list_conversations(B)).items == []
    turn = await store.record_turn(B, mine.id, "req-b", "injected", REPLY, usage("req-b", B))
    assert turn.messages == ()
    # A's request id is no handle on A's turn: under B it is B's own, another turn.
    theirs = await store.record_turn(B, mine.id, "req-a", "injected", REPLY, usage("req-a", B))
    assert (theirs.duplicate, theirs.messages) == (False, ())
    assert await store.messages(A, mine.id) == before
    still = await store.get_conversation(A, mine.id)
    assert (still.id, still.title, still.tenant_id) == (mine.id, "private", A)


async def test_a_turn_stores_both_messages_with_exact_costs_in_order(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    first = await store.record_turn(A, conv.id, "req-1", "q1", REPLY, usage("req-1"))
    second = await store.record_turn(A, conv.id, "req-2", None, REPLY, usage("req-2"))
    assert [m.seq for m in first.messages + second.messages] == [1, 2, 3]
    stored = await store.messages(A, conv.id)
    assert stored == [*first.messages, *second.messages]
    assert [(m.role, m.content) for m in stored] == [
        (Role.USER, "q1"),
        (Role.ASSISTANT, REPLY.content),
        (Role.ASSISTANT, REPLY.content),
    ]
    reply = stored[1]
    assert reply.cost_usd == Decimal("0.000000123456789012345")
    assert (reply.input_tokens, reply.output_tokens, reply.cached_input_tokens) == (12, 7, 4)
    assert (reply.model, reply.finish_reason, reply.request_id) == ("m", "FINISH_REASON_STOP", "req-1")
    assert (await store.get_conversation(A, conv.id)).updated_at > conv.updated_at


async def test_a_repeated_turn_is_a_no_op(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    first = await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    again = await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.messages == first.messages
    assert count(store, zs.messages) == 2
    assert count(store, zs.usage_outbox) == 1


async def test_a_user_message_appended_first_is_not_stored_twice(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    asked = await store.append_user_message(A, conv.id, "q", request_id="req-1")
    assert await store.append_user_message(A, conv.id, "q", request_id="req-1") == asked
    turn = await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    assert turn.messages[0] == asked
    assert [m.seq for m in await store.messages(A, conv.id)] == [1, 2]


async def test_a_turn_without_a_conversation_records_only_usage(store: ZoneStore) -> None:
    turn = await store.record_turn(A, None, "req-1", "q", REPLY, usage("req-1"))
    assert (turn.duplicate, turn.messages) == (False, ())
    assert count(store, zs.messages) == 0
    assert await store.pending_usage() == [PendingUsage(A, "req-1", usage("req-1"))]


async def test_a_failure_mid_turn_leaves_neither_messages_nor_usage(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    # The conversation's updated_at is the turn's last write: messages and usage row are in by then.
    with failing_once(store, "UPDATE CONVERSATIONS", crash) as fired, pytest.raises(RuntimeError):
        await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    assert fired
    assert count(store, zs.messages) == 0
    assert count(store, zs.usage_outbox) == 0
    # The same turn recorded again (the gateway's retry) lands whole.
    turn = await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    assert not turn.duplicate and len(turn.messages) == 2


async def test_a_serialization_failure_reruns_the_whole_turn_once(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    # Fails after the usage row went in: the rerun must not find it and call the turn a duplicate.
    with failing_once(store, "INSERT INTO MESSAGES", serialization_failure) as fired:
        turn = await store.record_turn(A, conv.id, "req-1", "q", REPLY, usage("req-1"))
    assert len(fired) == 1
    assert not turn.duplicate
    assert [m.seq for m in await store.messages(A, conv.id)] == [1, 2]
    assert count(store, zs.usage_outbox) == 1


async def test_errors_that_are_not_conflicts_are_not_retried(store: ZoneStore) -> None:
    def constraint(cursor: Any) -> None:
        if isinstance(cursor, sqlite3.Cursor):
            raise sqlite3.IntegrityError("injected")
        cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = 'unique_violation'; END $$")

    with failing_once(store, "INSERT INTO USAGE_OUTBOX", constraint), pytest.raises(sa.exc.IntegrityError):
        await store.record_turn(A, None, "req-1", None, REPLY, usage("req-1"))
    assert count(store, zs.usage_outbox) == 0


async def test_the_outbox_hands_out_unshipped_rows_least_tried_first(store: ZoneStore) -> None:
    for rid in ("req-1", "req-2", "req-3"):
        await store.record_turn(A, None, rid, None, REPLY, usage(rid))
    await store.note_attempt([UsageKey(A, "req-1")])
    assert [row.request_id for row in await store.pending_usage(2)] == ["req-2", "req-3"]
    assert await store.mark_shipped([UsageKey(A, "req-2"), UsageKey(A, "req-unknown")]) == 1
    assert await store.mark_shipped([UsageKey(A, "req-2")]) == 0
    assert await store.pending_usage() == [
        PendingUsage(A, "req-3", usage("req-3")),
        PendingUsage(A, "req-1", usage("req-1")),
    ]
    assert await store.pending_usage_count() == 2
    await store.note_attempt([UsageKey(A, "req-2")])  # shipped rows are left alone
    assert count(store, zs.usage_outbox, zs.usage_outbox.c.attempts > 0) == 1


async def test_request_ids_are_each_tenants_own(store: ZoneStore) -> None:
    mine, theirs = await store.create_conversation(A, "m"), await store.create_conversation(B, "m")
    asked_a = await store.append_user_message(A, mine.id, "a asks", request_id="req-1")
    asked_b = await store.append_user_message(B, theirs.id, "b asks", request_id="req-1")
    assert asked_a.id != asked_b.id
    turn_a = await store.record_turn(A, mine.id, "req-1", "a asks", REPLY, usage("req-1"))
    turn_b = await store.record_turn(B, theirs.id, "req-1", "b asks", REPLY, usage("req-1", B))
    assert not turn_a.duplicate and not turn_b.duplicate
    assert [m.content for m in turn_b.messages] == ["b asks", REPLY.content]
    assert [m.conversation_id for m in turn_a.messages] == [mine.id, mine.id]
    assert (await store.record_turn(A, mine.id, "req-1", "a asks", REPLY, usage("req-1"))).duplicate
    assert await store.pending_usage() == [
        PendingUsage(A, "req-1", usage("req-1")),
        PendingUsage(B, "req-1", usage("req-1", B)),
    ]
    # Shipping one tenant's row leaves the other's pending.
    assert await store.mark_shipped([UsageKey(B, "req-1")]) == 1
    assert await store.pending_usage() == [PendingUsage(A, "req-1", usage("req-1"))]


@pytest.mark.parametrize("kind", ["file", pytest.param("postgresql", marks=pytest.mark.services)])
async def test_each_region_ships_its_own_rows(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    store_url = (
        f"sqlite:///{tmp_path / 'eu.db'}"
        if kind == "file"
        else request.getfixturevalue("postgres_schema_url")
    )
    west, central = open_store(store_url), open_store(store_url, region="eu-central")
    try:
        await west.record_turn(A, None, "req-w", None, REPLY, usage("req-w"))
        await central.record_turn(A, None, "req-c", None, REPLY, usage("req-c"))
        assert [row.request_id for row in await west.pending_usage()] == ["req-w"]
        assert [row.request_id for row in await central.pending_usage()] == ["req-c"]
    finally:
        west.dispose()
        central.dispose()


async def test_a_store_refuses_names_that_cannot_make_a_conversation_id() -> None:
    engine = create_store_engine("sqlite://")
    with pytest.raises(ValueError, match="cannot name"):
        ZoneStore(engine, "eu-x", "eu-west")
    engine.dispose()


@pytest.mark.services
async def test_concurrent_turns_on_one_conversation_get_distinct_consecutive_seqs(
    postgres_schema_url: str,
) -> None:
    # Two engines (two pools), as two region processes of one zone would have.
    first, second = open_store(postgres_schema_url), open_store(postgres_schema_url, region="eu-central")
    try:
        conv = await first.create_conversation(A, "m")
        turns = await asyncio.gather(
            *(
                (first, second)[i % 2].record_turn(A, conv.id, f"req-{i}", f"q{i}", REPLY, usage(f"req-{i}"))
                for i in range(12)
            )
        )
        stored = await second.messages(A, conv.id)
        assert [m.seq for m in stored] == list(range(1, 25))
        for turn in turns:
            user, reply = turn.messages
            assert (user.role, reply.role, reply.seq) == (Role.USER, Role.ASSISTANT, user.seq + 1)
        # The same request racing itself is recorded once.
        racing = await asyncio.gather(
            *(
                (first, second)[i % 2].record_turn(A, conv.id, "req-x", "q", REPLY, usage("req-x"))
                for i in range(6)
            )
        )
        assert sum(not r.duplicate for r in racing) == 1
        assert count(first, zs.messages, zs.messages.c.request_id == "req-x") == 2
        assert count(first, zs.usage_outbox, zs.usage_outbox.c.request_id == "req-x") == 1
    finally:
        first.dispose()
        second.dispose()


async def test_not_found_is_a_mesh_error_with_the_conversation_named(store: ZoneStore) -> None:
    with pytest.raises(MeshError) as info:
        await store.messages(A, "conv_eu_eu-west_0123456789abcdef")
    assert info.value.metadata == {"conversation_id": "conv_eu_eu-west_0123456789abcdef"}
