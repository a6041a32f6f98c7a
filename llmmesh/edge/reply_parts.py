"""The parts of a reply besides its text, in OpenAI's shapes: tool-call
fragments as a stream sends them, whole tool calls, and log probabilities;
and :class:`ReplyCollector`, which gathers a turn's deltas into one
``chat.completion`` message.

A stream's tool-call fragment is ``{"index", "id", "type": "function",
"function": {"name", "arguments"}}`` for a call's first part and
``{"index", "function": {"arguments"}}`` for later ones, as OpenAI sends
them. Log probabilities are ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from llmmesh.core.tool_calls import ToolCallMerger
from llmmesh.v1 import chat_service_pb2, common_pb2

JsonObject = dict[str, object]


def tool_call_fragment(part: common_pb2.ToolCallDelta) -> JsonObject:
    """One streamed fragment of a tool call."""
    if part.id or part.name:
        return {
            "index": part.index,
            "id": part.id,
            "type": "function",
            "function": {"name": part.name, "arguments": part.arguments},
        }
    return {"index": part.index, "function": {"arguments": part.arguments}}


def _top(top: common_pb2.TopLogprob) -> JsonObject:
    return {"token": top.token, "logprob": top.logprob, "bytes": list(top.token_bytes)}


def token_logprob(entry: common_pb2.TokenLogprob) -> JsonObject:
    """One output token's log probability and its likeliest alternatives."""
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.token_bytes),
        "top_logprobs": [_top(t) for t in entry.top],
    }


def logprobs_object(entries: Iterable[common_pb2.TokenLogprob]) -> JsonObject:
    """A choice's ``logprobs``."""
    return {"content": [token_logprob(e) for e in entries], "refusal": None}


def tool_call_objects(calls: Iterable[common_pb2.ToolCall]) -> list[JsonObject]:
    """Whole calls as a message's ``tool_calls``."""
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


@dataclass
class ReplyCollector:
    """Gathers a turn's deltas: its text, its tool calls and its tokens'
    log probabilities."""

    text: list[str] = field(default_factory=list)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    calls: ToolCallMerger = field(default_factory=ToolCallMerger)

    def add(self, delta: chat_service_pb2.ChatDelta) -> None:
        self.text.append(delta.text)
        self.calls.add(delta.tool_calls)
        self.logprobs.extend(delta.logprobs)

    def message(self) -> JsonObject:
        """The assistant message: ``content`` is null when the reply is only
        tool calls; ``tool_calls`` is present when it made any."""
        text = "".join(self.text)
        message: JsonObject = {"role": "assistant", "content": text, "refusal": None}
        if self.calls:
            message["content"] = text or None
            message["tool_calls"] = tool_call_objects(self.calls.calls())
        return message
