"""Summaries of long conversations on a running in-process mesh whose pod has
a small context window: once a branch no longer fits, the region's smallest
model summarises the turns left out, the summary is stored in the zone
store, and later turns put it in their place and say so in ChatStarted."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from llmmesh.core.grpcserver import open_channel
from llmmesh.region.zone_store import schema as zs
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from tests.stack import DEV_KEY, running_stack

pytestmark = pytest.mark.asyncio

ME = (("authorization", f"Bearer {DEV_KEY}"),)


async def turn(
    chat: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str, text: str
) -> list[chat_service_pb2.ChatResponse]:
    call = chat.Chat(metadata=ME)
    start = chat_service_pb2.ChatStart(
        model="auto",
        conversation_id=conversation_id,
        messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)],
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )
    await call.write(chat_service_pb2.ChatRequest(start=start))
    await call.done_writing()
    events = [event async for event in call]
    assert events[-1].HasField("finished"), events[-1]
    return events


async def test_a_long_branch_is_summarised_and_the_summary_stands_for_its_oldest_turns() -> None:
    async with running_stack(context_window=256) as stack:
        store = stack.region.store
        async with open_channel(stack.region.address) as channel:
            chat = chat_service_pb2_grpc.ChatServiceStub(channel)
            conv = (
                await chat.CreateConversation(chat_service_pb2.CreateConversationRequest(), metadata=ME)
            ).conversation
            reports = []
            for n in range(12):
                events = await turn(
                    chat, conv.id, f"Fact {n}: the number {n} is " + "very " * 12 + "important."
                )
                reports.append(events[0].started.context)
            # The history outgrew the window: turns were left out, and a summary was asked for.
            assert any(r.dropped_messages for r in reports)
            summaries = sa.select(zs.summaries.c.turns, zs.summaries.c.content, zs.summaries.c.home_region)
            query = summaries.where(zs.summaries.c.conversation_id == conv.id)

            def read(conn: sa.Connection) -> list[sa.Row[tuple[int, str, str]]]:
                return list(conn.execute(query))

            stored: list[sa.Row[tuple[int, str, str]]] = []
            for _ in range(100):
                # In the store's own transaction: the region writes meanwhile.
                stored = store.run_transaction(read)
                if stored:
                    break
                await asyncio.sleep(0.05)
            assert stored and stored[0].turns > 0 and stored[0].content
            assert stored[0].home_region == "us-east"
            events = await turn(chat, conv.id, "What was fact 0?")
            context = events[0].started.context
            assert context.summarised_turns >= stored[0].turns
