"""A conversation turn's lead (the mesh's own context: retrieval excerpts,
remembered facts) in :func:`region.turn.conversation_context.conversation_context`,
on a zone store in an SQLite file: it follows the conversation's system
prompt, is kept whole when history is cut to fit the window, and a
regeneration's question is the stored one it answers again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.turn.conversation_context import conversation_context, turn_question
from llmmesh.region.zone_store import AssistantMessage, ZoneStore
from llmmesh.v1 import chat_service_pb2, common_pb2

pytestmark = pytest.mark.asyncio
A = "tenant-a"
SYSTEM, USER = common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_USER
LEAD = common_pb2.ChatMessage(role=SYSTEM, content="[1] (kb.txt) The keeper is Mirta Quon.")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ZoneStore]:
    opened = ZoneStore(create_store_engine(f"sqlite:///{tmp_path / 'us.db'}"), "us", "us-east")
    opened.create_schema()
    yield opened
    opened.dispose()


async def words(messages: Sequence[common_pb2.ChatMessage]) -> int:
    return sum(len(m.content.split()) for m in messages)


async def test_the_lead_follows_the_system_prompt_and_survives_the_cut(store: ZoneStore) -> None:
    conv = await store.create_conversation(A, "m", system_prompt="Be brief.")
    for n in range(6):
        ask = f"question {n} " + "word " * 10
        reply = AssistantMessage(f"answer {n} " + "word " * 10, "m", "FINISH_REASON_STOP", 3, 2)
        await store.record_turn(A, conv.id, f"r{n}", ask, reply, b"u", 5)
    start = chat_service_pb2.ChatStart(
        conversation_id=conv.id, messages=[common_pb2.ChatMessage(role=USER, content="Who keeps it?")]
    )
    context = await conversation_context(
        store,
        A,
        start,
        continues="",
        window_tokens=60,
        reserve_output_tokens=5,
        count_tokens=words,
        lead=[LEAD],
    )
    sent = list(context.messages)
    assert [m.content for m in sent[:2]] == ["Be brief.", LEAD.content]
    assert sent[-1].content == "Who keeps it?" and context.report.dropped_messages > 0
    assert await turn_question(store, A, start) == "Who keeps it?"

    rows = await store.messages(A, conv.id)
    again = chat_service_pb2.ChatStart(conversation_id=conv.id, regenerate_message_id=rows[-1].id)
    assert (await turn_question(store, A, again)).startswith("question 5 ")
