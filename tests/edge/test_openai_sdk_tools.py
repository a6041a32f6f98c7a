"""Function calling through the official ``openai`` SDK against the
in-process mesh with the simulator: tool_choice required, named and auto,
tool calls streamed as OpenAI's fragments and whole, tool role messages in
the history, parallel_tool_calls, sync and async."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from tests.edge.sdk import async_client, function_tool, object_schema, sync_client
from tests.stack import Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One mesh for the module's tests: none leaves anything another reads."""
    return shared_stack


CITY = object_schema(city={"type": "string"})
CLOCK = object_schema(zone={"type": "string", "enum": ["utc", "cet"]})
TOOLS: list[ChatCompletionToolParam] = [
    function_tool("get_weather", CITY, strict=True),
    function_tool("get_time", CLOCK, strict=True),
]
SCHEMAS = {"get_weather": CITY, "get_time": CLOCK}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is it like in Oslo?"}]
USE_WEATHER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Please use get_weather for Oslo."}
]


def check_call(name: str, arguments: str) -> dict[str, Any]:
    """The call's arguments, after checking they are valid for its function."""
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, SCHEMAS[name])
    assert isinstance(parsed, dict)
    return parsed


async def test_required_tool_choice_returns_valid_calls_and_finish_reason_tool_calls(stack: Stack) -> None:
    async with async_client(stack) as client:
        completion = await client.chat.completions.create(
            model="auto", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        check_call(call.function.name, call.function.arguments)
    assert completion.usage is not None and completion.usage.completion_tokens > 0


async def test_a_named_tool_choice_calls_that_function(stack: Stack) -> None:
    async with async_client(stack) as client:
        completion = await client.chat.completions.create(
            model="auto",
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=200,
        )
    calls = completion.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_time"]  # type: ignore[union-attr]
    assert check_call("get_time", calls[0].function.arguments)["zone"] in ("utc", "cet")  # type: ignore[union-attr]


async def test_auto_calls_a_tool_the_user_names_and_answers_in_text_otherwise(stack: Stack) -> None:
    async with async_client(stack) as client:
        named = await client.chat.completions.create(
            model="auto", messages=USE_WEATHER, tools=TOOLS, tool_choice="auto", max_tokens=200
        )
        plain = await client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "Tell me a story."}],
            tools=TOOLS,
            max_tokens=20,
        )
        never = await client.chat.completions.create(
            model="auto", messages=USE_WEATHER, tools=TOOLS, tool_choice="none", max_tokens=20
        )
    assert named.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in named.choices[0].message.tool_calls or []] == ["get_weather"]  # type: ignore[union-attr]
    for reply in (plain, never):
        assert reply.choices[0].message.tool_calls is None
        assert reply.choices[0].message.content and reply.choices[0].finish_reason in ("stop", "length")


async def test_streamed_tool_calls_are_fragments_that_assemble_into_the_whole_reply(stack: Stack) -> None:
    async with async_client(stack) as client:
        whole = await client.chat.completions.create(
            model="auto", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, seed=5
        )
        stream = await client.chat.completions.create(
            model="auto",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=200,
            seed=5,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for part in chunk.choices[0].delta.tool_calls or []:
            assert part.function is not None
            if part.index not in calls:
                # A call's first fragment names it.
                assert part.id and part.type == "function" and part.function.name
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
            else:
                assert part.id is None and part.function.name is None
            calls[part.index]["arguments"] += part.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(c.choices[0].delta.content in (None, "") for c in chunks)
    assert sorted(calls) == list(range(len(calls)))
    expected = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected
    for call in calls.values():
        check_call(call["name"], call["arguments"])


async def test_tool_results_in_the_history_get_a_text_answer(stack: Stack) -> None:
    async with async_client(stack) as client:
        first = await client.chat.completions.create(
            model="auto", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200
        )
        message = first.choices[0].message
        history: list[ChatCompletionMessageParam] = [
            *ASK,
            message.model_dump(exclude_none=True),  # type: ignore[list-item]
        ]
        for call in message.tool_calls or []:
            history.append({"role": "tool", "tool_call_id": call.id, "content": "12 degrees and rain"})
        answer = await client.chat.completions.create(
            model="auto", messages=history, tools=TOOLS, max_tokens=16
        )
    assert answer.choices[0].message.content
    assert answer.choices[0].message.tool_calls is None


async def test_parallel_tool_calls_false_makes_at_most_one_call(stack: Stack) -> None:
    async with async_client(stack) as client:
        for seed in range(4):
            completion = await client.chat.completions.create(
                model="auto",
                messages=ASK,
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=200,
                seed=seed,
                temperature=1.0,
            )
            assert len(completion.choices[0].message.tool_calls or []) == 1


async def test_the_sync_client_gets_tool_calls_whole_and_streamed(stack: Stack) -> None:
    def run() -> tuple[list[str], str | None]:
        with sync_client(stack) as client:
            whole = client.chat.completions.create(
                model="auto", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200
            )
            stream = client.chat.completions.create(
                model="auto", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, stream=True
            )
            reasons = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
        names = [c.function.name for c in whole.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
        return names, reasons[-1] if reasons else None

    names, streamed_reason = await asyncio.to_thread(run)
    assert names and set(names) <= set(SCHEMAS)
    assert streamed_reason == "tool_calls"
