"""A conversation as a tree in the zone store (SQLite file and PostgreSQL):
turns hang under the newest message unless they name a parent, edits and
regenerations make branches, and a store whose conversations were lists
becomes one of one-branch trees when a region opens it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.zone_store import AssistantMessage, Role, SummaryRow, ZoneStore
from llmmesh.region.zone_store.tree import branches, current_branch, path_to

pytestmark = pytest.mark.asyncio

A = "tenant-a"


def reply(text: str) -> AssistantMessage:
    return AssistantMessage(text, "m", "FINISH_REASON_STOP", 3, 2)


@pytest.fixture(params=["file", pytest.param("postgresql", marks=pytest.mark.services)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"sqlite:///{tmp_path / 'eu.db'}"
    found: str = request.getfixturevalue("postgres_schema_url")
    return found


@pytest.fixture
def store(url: str) -> Iterator[ZoneStore]:
    opened = ZoneStore(create_store_engine(url), "eu", "eu-west")
    opened.create_schema()
    yield opened
    opened.dispose()


async def turn(
    store: ZoneStore, conversation_id: str, rid: str, ask: str | None, parent: str | None = None
) -> tuple[str, ...]:
    record = await store.record_turn(
        A, conversation_id, rid, ask, reply(f"re: {ask}"), b"u", 5, parent_id=parent
    )
    return tuple(m.id for m in record.messages)


async def test_turns_chain_under_the_newest_message_and_branches_fork_where_asked(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    q1, a1 = await turn(store, conv.id, "r1", "one")
    q2, a2 = await turn(store, conv.id, "r2", "two")
    rows = await store.messages(A, conv.id)
    assert [(m.id, m.parent_id) for m in rows] == [(q1, ""), (a1, q1), (q2, a1), (a2, q2)]

    # An edit of the second question: a sibling of it, under the first answer.
    q2b, a2b = await turn(store, conv.id, "r3", "two, edited", parent=a1)
    # A regeneration of the first answer: a sibling of it, no new question.
    (a1b,) = await turn(store, conv.id, "r4", None, parent=q1)
    # An edit of the first question: a new first message.
    q1c, a1c = await turn(store, conv.id, "r5", "one, edited", parent="")

    rows = await store.messages(A, conv.id)
    assert [m.id for m in current_branch(rows)] == [q1c, a1c]
    assert [m.id for m in path_to(rows, a2b)] == [q1, a1, q2b, a2b]
    assert [m.content for m in path_to(rows, a1b)] == ["one", "re: None"]
    found = branches(rows)
    assert [(b.leaf_id, b.message_count, b.fork_id, b.current) for b in found] == [
        (a1c, 2, "", True),
        (a1b, 2, q1, False),
        (a2b, 4, a1, False),
        (a2, 4, "", False),
    ]
    # A turn continuing an older branch makes it current.
    q4, a4 = await turn(store, conv.id, "r6", "three", parent=a2)
    rows = await store.messages(A, conv.id)
    assert [m.id for m in current_branch(rows)] == [q1, a1, q2, a2, q4, a4]


async def test_a_repeated_turn_keeps_its_place_in_the_tree(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    q1, a1 = await turn(store, conv.id, "r1", "one")
    await turn(store, conv.id, "r2", "two")
    again = await store.record_turn(A, conv.id, "r1", "one", reply("x"), b"u", 5, parent_id="")
    assert again.duplicate and [m.id for m in again.messages] == [q1, a1]
    assert len(await store.messages(A, conv.id)) == 4


async def test_a_store_of_message_lists_becomes_one_of_one_branch_trees(url: str, store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    ids = [i for n in range(3) for i in await turn(store, conv.id, f"r{n}", f"q{n}")]
    other = await store.create_conversation(A, "m")
    other_ids = await turn(store, other.id, "s1", "elsewhere")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE messages DROP COLUMN parent_id")
        # As a release before migrations left it: no revision recorded, nor any table added since.
        conn.exec_driver_sql("DROP TABLE llmmesh_zone_revision")
        conn.exec_driver_sql("DROP TABLE zone_keys")
    store.dispose()

    for _ in range(2):  # opening it again changes nothing more
        reopened = ZoneStore(create_store_engine(url), "eu", "eu-west")
        reopened.create_schema()
        rows = await reopened.messages(A, conv.id)
        assert [(m.id, m.parent_id) for m in rows] == list(zip(ids, ["", *ids[:-1]], strict=True))
        assert [m.parent_id for m in await reopened.messages(A, other.id)] == ["", other_ids[0]]
        assert [m.role for m in current_branch(rows)] == [Role.USER, Role.ASSISTANT] * 3
        with reopened.engine.connect() as conn:
            indexes = {i["name"] for i in sa.inspect(conn).get_indexes("conversations")}
        assert "ix_conversations_deleted" in indexes
        reopened.dispose()


async def test_a_summary_serves_every_branch_through_its_last_message(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m")
    q1, a1 = await turn(store, conv.id, "r1", "one")
    q2, a2 = await turn(store, conv.id, "r2", "two")
    _, a2b = await turn(store, conv.id, "r3", "two, again", parent=a1)
    q1c, a1c = await turn(store, conv.id, "r4", "one, edited", parent="")
    when = (await store.get_conversation(A, conv.id)).created_at
    first = SummaryRow(conv.id, a1, 1, "They spoke of one.", "m", when)
    assert await store.save_summary(A, first)
    assert not await store.save_summary(A, first)  # one per message summarised through
    longer = SummaryRow(conv.id, a2, 2, "They spoke of one and two.", "m", when)
    assert await store.save_summary(A, longer)
    assert await store.branch_summary(A, conv.id, [q1, a1, q2, a2]) == longer
    assert await store.branch_summary(A, conv.id, [q1, a1, "x", a2b]) == first
    assert await store.branch_summary(A, conv.id, [q1c, a1c]) is None
    await store.soft_delete_conversation(A, conv.id)
    assert not await store.save_summary(A, SummaryRow(conv.id, a2b, 2, "late", "m", when))
