"""The zone store keeps a reply's tool calls and a turn's tool messages: one
message per call answered, once however often the turn is recorded, and
once when a continuation records the turn too (SQLite and PostgreSQL)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llmmesh.region.conversations import message_proto
from llmmesh.region.zone_store import AssistantMessage, Role, ToolCallRow, ToolResult, ZoneStore
from llmmesh.region.zone_store.rows import ContinuedTurn
from llmmesh.v1 import billing_service_pb2, common_pb2

pytestmark = pytest.mark.asyncio

T = "tenant-a"
CALLS = (
    ToolCallRow("call_1", "get_weather", '{"city": "Oslo"}'),
    ToolCallRow("call_2", "get_time", '{"zone": "CET"}'),
)
ANSWERS = (ToolResult("call_1", "12 C"), ToolResult("call_2", "noon"))


def usage(request_id: str) -> bytes:
    return billing_service_pb2.UsageRecord(request_id=request_id, tenant_id=T).SerializeToString()


def reply(
    content: str, *, calls: tuple[ToolCallRow, ...] = (), reason: str = "FINISH_REASON_STOP"
) -> AssistantMessage:
    return AssistantMessage(content, "m", reason, 10, 4, cost_usd=Decimal("0.001"), tool_calls=calls)


def encode(request_id: str, input_tokens: int, output_tokens: int, continues: str) -> bytes:
    return usage(request_id)


async def test_tool_calls_and_answers_are_kept_once(regions: tuple[ZoneStore, ZoneStore]) -> None:
    store, _ = regions
    conversation = await store.create_conversation(T, "m")
    asked = reply("", calls=CALLS, reason="FINISH_REASON_TOOL_CALLS")
    await store.record_turn(T, conversation.id, "req-1", "weather and time?", asked, usage("req-1"), 14)
    for _ in range(2):  # a repeated turn changes nothing
        await store.record_turn(
            T, conversation.id, "req-2", None, reply("12 C at noon."), usage("req-2"), 14, ANSWERS
        )
    stored = await store.messages(T, conversation.id)
    assert [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in stored] == [
        (Role.USER, "weather and time?", (), ""),
        (Role.ASSISTANT, "", CALLS, ""),
        (Role.TOOL, "12 C", (), "call_1"),
        (Role.TOOL, "noon", (), "call_2"),
        (Role.ASSISTANT, "12 C at noon.", (), ""),
    ]
    shown = [message_proto(m) for m in stored]
    assert [(c.id, c.name, c.arguments) for c in shown[1].tool_calls] == [
        (c.id, c.name, c.arguments) for c in CALLS
    ]
    assert shown[1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert (shown[2].role, shown[2].tool_call_id) == (common_pb2.CHAT_ROLE_TOOL, "call_1")


@pytest.mark.parametrize("first", ["failed region", "continuing region"])
async def test_a_continued_turn_keeps_its_tool_messages_and_whole_calls_once(
    regions: tuple[ZoneStore, ZoneStore], first: str
) -> None:
    east, west = regions
    conversation = await east.create_conversation(T, "m")
    partial = reply("", calls=(ToolCallRow("call_9", "get_weather", '{"ci'),), reason="FINISH_REASON_ERROR")
    whole = reply("", calls=(ToolCallRow("call_9", "get_weather", '{"city": "Oslo"}'),))

    async def failed_region_records() -> None:
        await east.record_turn(T, conversation.id, "req-x", None, partial, usage("req-x"), 12, ANSWERS)

    async def continuing_region_records() -> None:
        await west.record_continuation(
            T, conversation.id, "req-x-r2", None, ContinuedTurn("req-x", 10, 2, ""), whole, 2, encode, ANSWERS
        )

    if first == "failed region":
        await failed_region_records()
        await continuing_region_records()
    else:
        await continuing_region_records()
        await failed_region_records()  # late: a no-op
    stored = await west.messages(T, conversation.id)
    assert [(m.role, m.tool_call_id, m.request_id) for m in stored] == [
        (Role.TOOL, "call_1", "req-x"),
        (Role.TOOL, "call_2", "req-x"),
        (Role.ASSISTANT, "", "req-x"),
    ]
    assert stored[-1].tool_calls == whole.tool_calls
