"""The Responses API through the official ``openai`` SDK: ``responses.create``
(a string, an item list, instructions), ``responses.stream``, ``parse``
with a pydantic model, function tools round trip, stored responses
(``retrieve``, ``delete``, ``input_items.list``, ``previous_response_id``),
``store: false``, tenants kept apart and refusals naming their param."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.edge.sdk import async_client, object_schema
from tests.edge.test_conversations_api import new_tenant
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASK = "Say something about meshes."
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {**object_schema(city={"type": "string"}), "additionalProperties": False},
}


async def test_create_retrieve_list_items_and_delete(shared_stack: Stack) -> None:
    async with async_client(shared_stack) as client:
        made = await client.responses.create(
            model="auto", input=ASK, instructions="Answer in one line.", max_output_tokens=12
        )
        assert made.object == "response" and made.id.startswith("resp_")
        assert made.status in ("completed", "incomplete") and made.output_text
        message = made.output[0]
        assert message.type == "message" and message.role == "assistant"
        assert message.content[0].type == "output_text" and message.content[0].annotations == []
        assert made.usage is not None and made.usage.output_tokens > 0
        assert made.usage.total_tokens == made.usage.input_tokens + made.usage.output_tokens
        assert made.instructions == "Answer in one line." and made.max_output_tokens == 12
        if made.status == "incomplete":
            assert made.incomplete_details is not None
            assert made.incomplete_details.reason == "max_output_tokens"

        got = await client.responses.retrieve(made.id)
        assert (got.id, got.output_text, got.status, got.model) == (
            made.id,
            made.output_text,
            made.status,
            made.model,
        )
        assert got.output[0].id == made.output[0].id
        assert got.usage is not None and got.usage.output_tokens == made.usage.output_tokens

        items: Any = await client.responses.input_items.list(made.id)
        assert [(i.type, i.role) for i in items.data] == [("message", "user")]
        assert items.data[0].content[0].text == ASK
        assert items.first_id == items.last_id == items.data[0].id and items.has_more is False

        await client.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError) as gone:
            await client.responses.retrieve(made.id)
    assert gone.value.code == "response_not_found"


async def test_previous_response_id_carries_the_thread(shared_stack: Stack) -> None:
    async with async_client(shared_stack) as client:
        first = await client.responses.create(
            model="auto",
            input=[{"role": "user", "content": [{"type": "input_text", "text": ASK}]}],
            max_output_tokens=10,
        )
        follow = "And why does that matter?"
        second = await client.responses.create(
            model="auto", previous_response_id=first.id, input=follow, max_output_tokens=10
        )
        alone = await client.responses.create(model="auto", input=follow, max_output_tokens=10, store=False)
        assert first.usage and second.usage and alone.usage
        # The second turn's prompt holds the first question and answer before its own.
        carried = second.usage.input_tokens - alone.usage.input_tokens
        assert carried >= first.usage.output_tokens + 5, (carried, first.usage)
        assert second.previous_response_id == first.id
        # An unstored follow-up gets the same context from the stored thread.
        unstored = await client.responses.create(
            model="auto", previous_response_id=first.id, input=follow, max_output_tokens=10, store=False
        )
        assert unstored.usage is not None
        assert unstored.output_text == second.output_text
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.retrieve(unstored.id)
        assert missing.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError) as no_previous:
            await client.responses.create(model="auto", previous_response_id=unstored.id, input="x")
    assert no_previous.value.param == "previous_response_id"


async def test_a_stream_has_openai_events_and_the_whole_text(shared_stack: Stack) -> None:
    async with async_client(shared_stack) as client:
        # Room to finish: the SDK's final response is a completed one's.
        whole = await client.responses.create(model="auto", input=ASK, max_output_tokens=400, store=False)
        async with client.responses.stream(model="auto", input=ASK, max_output_tokens=400) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert final.usage is not None and final.usage.output_tokens > 0
    # Stored: it reads back as it streamed.
    async with async_client(shared_stack) as client:
        assert (await client.responses.retrieve(final.id)).output_text == deltas


async def test_the_stream_is_framed_with_event_lines_and_no_done(shared_http: httpx.AsyncClient) -> None:
    body = {"model": "auto", "input": ASK, "max_output_tokens": 4, "stream": True, "store": False}
    resp = await shared_http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {DEV_KEY}"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    blocks = resp.text.strip().split("\n\n")
    assert "[DONE]" not in resp.text
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]


async def test_a_function_tool_round_trip(shared_stack: Stack) -> None:
    async with async_client(shared_stack) as client:
        called = await client.responses.create(
            model="auto",
            input="What is the weather in Paris?",
            tools=[WEATHER_TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
        )
        calls = [item for item in called.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather"
        assert set(json.loads(calls[0].arguments)) == {"city"}
        answered = await client.responses.create(
            model="auto",
            previous_response_id=called.id,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
            tools=[WEATHER_TOOL],
            max_output_tokens=16,
        )
        assert answered.output[0].type == "message" and answered.output_text
        items = await client.responses.input_items.list(answered.id, order="asc")
        assert [i.type for i in items.data] == ["function_call_output"]
        # The same turn stateless: the call and its output as items.
        stateless = await client.responses.create(
            model="auto",
            store=False,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": calls[0].call_id,
                    "name": "get_weather",
                    "arguments": calls[0].arguments,
                },
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
            ],
            tools=[WEATHER_TOOL],
            max_output_tokens=16,
        )
        assert stateless.output_text == answered.output_text


class Weather(BaseModel):
    city: str
    degrees: int


async def test_parse_follows_a_json_schema(shared_stack: Stack) -> None:
    async with async_client(shared_stack) as client:
        parsed = await client.responses.parse(
            model="auto", input="Weather in Oslo as JSON.", text_format=Weather, store=False
        )
    assert isinstance(parsed.output_parsed, Weather)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"metadata": {"team": "a"}}, "metadata"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
        (
            {"stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options.include_obfuscation",
        ),
        ({"previous_response_id": "resp_nope", "conversation": "conv_x"}, "previous_response_id"),
        ({"temperature": 3}, "temperature"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
async def test_refusals_name_their_param(
    shared_http: httpx.AsyncClient, params: dict[str, Any], param: str
) -> None:
    body = {"model": "auto", "input": ASK, **params}
    resp = await shared_http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {DEV_KEY}"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_another_tenant_cannot_see_a_response(shared_stack: Stack) -> None:
    other = await new_tenant(shared_stack, "responses-other")
    async with async_client(shared_stack) as client, async_client(shared_stack, other) as stranger:
        made = await client.responses.create(model="auto", input=ASK, max_output_tokens=4)
        for call in (
            stranger.responses.retrieve(made.id),
            stranger.responses.input_items.list(made.id),
            stranger.responses.delete(made.id),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.NotFoundError) as chained:
            await stranger.responses.create(model="auto", previous_response_id=made.id, input="x")
        assert chained.value.param == "previous_response_id"
        # Still there for its owner.
        assert (await client.responses.retrieve(made.id)).output_text == made.output_text


async def test_a_turn_added_to_a_conversation(shared_stack: Stack, shared_http: httpx.AsyncClient) -> None:
    auth = {"authorization": f"Bearer {DEV_KEY}"}
    conversation = (await shared_http.post("/v1/conversations", json={}, headers=auth)).json()["id"]
    async with async_client(shared_stack) as client:
        made = await client.responses.create(
            model="auto", input=ASK, conversation=conversation, max_output_tokens=6
        )
        assert made.conversation is not None and made.conversation.id == conversation
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.delete(made.id)
        assert refused.value.param == "response_id"
    listed = (await shared_http.get(f"/v1/conversations/{conversation}/messages", headers=auth)).json()
    assert [m["role"] for m in listed["data"]] == ["user", "assistant"]
    assert listed["data"][1]["content"] == made.output_text
