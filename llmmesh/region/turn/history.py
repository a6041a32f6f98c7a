"""A turn's messages between the wire and the zone store: stored rows as the
history the engine sees, a turn's tool messages as rows to store, and the
text the input filter reads.

Tool parts travel with their messages: a stored assistant reply's tool
calls and a stored tool message's call id come back into the history (the
prompt renders them, :mod:`region.turn.prompt_render`), so a conversation can go
on from a reply that called tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmmesh.region.conversations import CHAT_ROLES
from llmmesh.region.zone_store.rows import MessageRow, Role, ToolResult
from llmmesh.v1 import chat_service_pb2, common_pb2


def history_messages(rows: Iterable[MessageRow], leave_out_request: str = "") -> list[common_pb2.ChatMessage]:
    """A conversation's stored messages as the history of a new turn: every
    user, assistant and tool message with something in it (system prompts
    come from the conversation, not its messages), leaving out what request
    ``leave_out_request`` stored (a continuation's prompt is its original
    turn's, without that turn's own reply)."""
    return [
        history_message(row)
        for row in rows
        if row.role in CHAT_ROLES
        and row.role != Role.SYSTEM
        and (row.content or row.tool_calls or row.role == Role.TOOL)
        and not (leave_out_request and row.request_id == leave_out_request)
    ]


def history_message(row: MessageRow) -> common_pb2.ChatMessage:
    """One stored message as a chat message, with its tool parts."""
    return common_pb2.ChatMessage(
        role=CHAT_ROLES[row.role],
        content=row.content,
        tool_calls=[common_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in row.tool_calls],
        tool_call_id=row.tool_call_id,
    )


def tool_results(messages: Sequence[common_pb2.ChatMessage]) -> tuple[ToolResult, ...]:
    """A turn's tool messages, as the zone store keeps them."""
    return tuple(
        ToolResult(m.tool_call_id, m.content) for m in messages if m.role == common_pb2.CHAT_ROLE_TOOL
    )


def input_texts(start: chat_service_pb2.ChatStart) -> list[tuple[str, str]]:
    """What the input filter reads of a turn, as (role, text): every
    message's content, the arguments of the tool calls it carries, and the
    descriptions and parameters of the tools offered (all of it reaches the
    model)."""
    texts: list[tuple[str, str]] = []
    for message in start.messages:
        role = common_pb2.ChatRole.Name(message.role)
        texts.append((role, message.content))
        texts.extend((role, f"{call.name} {call.arguments}") for call in message.tool_calls)
    texts.extend(
        ("TOOLS", f"{tool.name} {tool.description} {tool.parameters_json}") for tool in start.sampling.tools
    )
    return texts
