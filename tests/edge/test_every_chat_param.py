"""Every parameter of the official SDK's Chat Completions request
(``CompletionCreateParams``), sent through the SDK to the in-process mesh
with the simulator: each is honoured, with an observable effect checked
against a plain reply, or refused with a 400 naming it. None is ignored;
a parameter the SDK gains and this table lacks fails the test."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.chat.completion_create_params import CompletionCreateParamsBase

import llmmesh.edge.region_session
import llmmesh.edge.turns
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.edge.sdk import async_client, function_tool, object_schema
from tests.stack import Stack

pytestmark = pytest.mark.asyncio
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about meshes."}]
TOOLS: list[ChatCompletionToolParam] = [function_tool("get_weather", object_schema(city={"type": "string"}))]
BASE: dict[str, Any] = {
    "model": "auto",
    "messages": ASK,
    "max_tokens": 30,
    "extra_body": {"ignore_eos": True},
}
# Tool calls and JSON end on their own: room for them, and no ignore_eos.
CALLS: dict[str, Any] = {"max_tokens": 300, "extra_body": {}}
Check = Callable[[Any, "Replies"], bool]
"""Whether a reply (a completion, or a stream's chunks) shows the parameter's effect."""


@dataclass
class Replies:
    """Plain replies to compare with: greedy, and sampled with seed 1."""

    greedy: ChatCompletion
    sampled: ChatCompletion
    starts: list[chat_service_pb2.ChatStart] = field(default_factory=list)


def text(reply: ChatCompletion) -> str:
    return reply.choices[0].message.content or ""


def ids(reply: ChatCompletion) -> list[int]:
    tokenizer = SimTokenizer()
    assert reply.choices[0].logprobs is not None
    return [tokenizer.encode(e.token)[0] for e in reply.choices[0].logprobs.content or []]


def most_repeated(reply: ChatCompletion) -> int:
    return Counter(ids(reply)).most_common(1)[0][1]


def banned_token(base: Replies) -> int:
    return Counter(ids(base.greedy)).most_common(1)[0][0]


def stops(base: Replies) -> list[str]:
    words = text(base.greedy).split()
    return [f" {words[9]}", f" {words[6]}"]


def check_tool_calls(reply: ChatCompletion, base: Replies, count: int | None = None) -> bool:
    calls = reply.choices[0].message.tool_calls or []
    return (
        bool(calls)
        and reply.choices[0].finish_reason == "tool_calls"
        and all(c.function.name == "get_weather" for c in calls)  # type: ignore[union-attr]
        and all(isinstance(json.loads(c.function.arguments)["city"], str) for c in calls)  # type: ignore[union-attr]
        and (count is None or len(calls) == count)
    )


def streamed_text(chunks: list[Any], base: Replies) -> bool:
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return streamed == text(base.greedy) and chunks[-1].choices[0].finish_reason == "length"


def last_chunk_usage(chunks: list[Any], base: Replies) -> bool:
    last = chunks[-1]
    return last.choices == [] and last.usage is not None and last.usage.completion_tokens == 30


def carried_as_end_user(value: str) -> Check:
    def check(reply: ChatCompletion, base: Replies) -> bool:
        # The region receives it as the turn's end-user id.
        return base.starts[-1].user == value

    return check


# name: (arguments besides BASE, the check of the reply); arguments may name
# the plain replies (a callable taking them).
HONOURED: list[tuple[str, dict[str, Any], Check]] = [
    ("model", {"model": "llmmesh-tiny"}, lambda r, b: r.model == "llmmesh-tiny"),
    (
        "messages",
        {"messages": [{"role": "user", "content": "Another topic."}]},
        lambda r, b: text(r) != text(b.greedy),
    ),
    (
        "max_tokens",
        {"max_tokens": 7},
        lambda r, b: r.usage.completion_tokens == 7,
    ),
    (
        "max_completion_tokens",
        {"max_completion_tokens": 5},
        lambda r, b: r.usage.completion_tokens == 5,
    ),
    (
        "temperature",
        {"temperature": 1.0, "seed": 1},
        lambda r, b: text(r) != text(b.greedy),
    ),
    ("seed", {"temperature": 1.0, "seed": 2}, lambda r, b: text(r) != text(b.sampled)),
    (
        "top_p",
        {"temperature": 1.0, "seed": 1, "top_p": 0.1},
        lambda r, b: text(r) != text(b.sampled),
    ),
    (
        "stop",
        {"stop": stops},
        lambda r, b: text(r) == text(b.greedy)[: min(text(b.greedy).index(s) for s in stops(b))],
    ),
    (
        "logprobs",
        {"logprobs": True},
        lambda r, b: len(r.choices[0].logprobs.content) == 30,
    ),
    (
        "top_logprobs",
        {"logprobs": True, "top_logprobs": 2},
        lambda r, b: all(len(e.top_logprobs) == 2 for e in r.choices[0].logprobs.content),
    ),
    (
        "frequency_penalty",
        {"logprobs": True, "frequency_penalty": 2.0},
        lambda r, b: most_repeated(r) < most_repeated(b.greedy),
    ),
    (
        "presence_penalty",
        {"logprobs": True, "presence_penalty": 2.0},
        lambda r, b: len(set(ids(r))) > len(set(ids(b.greedy))),
    ),
    (
        "logit_bias",
        {"logprobs": True, "logit_bias": lambda b: {str(banned_token(b)): -100}},
        lambda r, b: banned_token(b) not in ids(r),
    ),
    ("tools", {**CALLS, "tools": TOOLS, "tool_choice": "required"}, check_tool_calls),
    (
        "tool_choice",
        {**CALLS, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        check_tool_calls,
    ),
    (
        "parallel_tool_calls",
        {**CALLS, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        lambda r, b: check_tool_calls(r, b, 1),
    ),
    (
        "response_format",
        {**CALLS, "response_format": {"type": "json_object"}},
        lambda r, b: isinstance(json.loads(text(r)), dict),
    ),
    ("stream", {"stream": True}, streamed_text),
    ("stream_options", {"stream": True, "stream_options": {"include_usage": True}}, last_chunk_usage),
    ("n", {"n": 1}, lambda r, b: len(r.choices) == 1),
    (
        "modalities",
        {"modalities": ["text"]},
        lambda r, b: text(r) == text(b.greedy),
    ),
    ("store", {"store": False}, lambda r, b: text(r) == text(b.greedy)),
    (
        "service_tier",
        {"service_tier": "default"},
        lambda r, b: text(r) == text(b.greedy),
    ),
    (
        "reasoning_effort",
        {"reasoning_effort": "none"},
        lambda r, b: text(r) == text(b.greedy),
    ),
    (
        "verbosity",
        {"verbosity": "low"},
        # An instruction after the leading system messages, which the region sends the model.
        lambda r, b: (
            [m.role for m in b.starts[-1].messages][-2:]
            == [common_pb2.CHAT_ROLE_DEVELOPER, common_pb2.CHAT_ROLE_USER]
            and "briefly" in b.starts[-1].messages[-2].content
        ),
    ),
    ("user", {"user": "user-1"}, carried_as_end_user("user-1")),
    ("safety_identifier", {"safety_identifier": "hashed-2"}, carried_as_end_user("hashed-2")),
]

# name: a value the mesh refuses, with a 400 naming the parameter.
REFUSED: dict[str, Any] = {
    "n": 2,
    "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "Hello"},
    "web_search_options": {"search_context_size": "low"},
    "reasoning_effort": "high",
    "functions": [{"name": "get_weather", "parameters": {"type": "object"}}],
    "function_call": "auto",
    "store": True,
    "metadata": {"team": "a"},
    "service_tier": "flex",
    "prompt_cache_key": "key-1",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "explicit"},
    "moderation": {"model": "omni-moderation-latest"},
}


def documented_parameters() -> set[str]:
    # ``stream`` is declared by the streaming and non-streaming subclasses.
    return set(CompletionCreateParamsBase.__annotations__) | {"stream"}


async def test_every_documented_parameter_is_honoured_or_refused(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    covered = {name for name, _, _ in HONOURED} | set(REFUSED)
    assert covered == documented_parameters(), "parameters without a case: add them to a table"
    starts: list[chat_service_pb2.ChatStart] = []
    sent = llmmesh.edge.region_session.start_message

    def recording(start: chat_service_pb2.ChatStart, api_key: str) -> chat_service_pb2.ChatSessionRequest:
        starts.append(start)
        return sent(start, api_key)

    monkeypatch.setattr(llmmesh.edge.turns, "start_message", recording)
    async with async_client(stack) as client:
        base = Replies(
            greedy=await client.chat.completions.create(**BASE, logprobs=True),
            sampled=await client.chat.completions.create(**BASE, temperature=1.0, seed=1),
            starts=starts,
        )
        for name, arguments, check in HONOURED:
            resolved = {k: v(base) if callable(v) else v for k, v in arguments.items()}
            reply = await client.chat.completions.create(**{**BASE, **resolved})
            if isinstance(reply, openai.AsyncStream):
                reply = [chunk async for chunk in reply]
            assert check(reply, base), f"{name} was accepted without its effect"
        for name, value in REFUSED.items():
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(**{**BASE, name: value})
            assert refused.value.param == name, name
            assert refused.value.code == "unsupported_parameter", name
