"""Tools in a conversation: a message turn takes the same parameters as a
chat completion (tools, tool_choice, response_format, logprobs, ...), the
stored history keeps the reply's tool calls and the tool results, and a
turn of tool results alone gets the model's answer."""

from __future__ import annotations

import httpx
import pytest

from tests.edge.test_conversations_api import AUTH, create
from tests.edge.test_every_chat_param import TOOLS

pytestmark = pytest.mark.asyncio


async def test_a_conversation_stores_tool_calls_and_their_results(http: httpx.AsyncClient) -> None:
    conversation = await create(http)
    url = f"/v1/conversations/{conversation['id']}/messages"
    asked = await http.post(
        url,
        json={"content": "Weather in Oslo?", "tools": TOOLS, "tool_choice": "required", "max_tokens": 200},
        headers=AUTH,
    )
    assert asked.status_code == 200, asked.text
    choice = asked.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    answered = await http.post(
        url,
        json={
            "messages": [{"role": "tool", "tool_call_id": call["id"], "content": "12 degrees"}],
            "tools": TOOLS,
            "max_tokens": 12,
        },
        headers=AUTH,
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"]
    listed = (await http.get(url, headers=AUTH)).json()["data"]
    assert [m["role"] for m in listed] == ["user", "assistant", "tool", "assistant"]
    assert listed[1]["tool_calls"] == [call]
    assert listed[1]["finish_reason"] == "tool_calls"
    assert listed[2]["tool_call_id"] == call["id"] and listed[2]["content"] == "12 degrees"
    assert listed[3]["tool_calls"] is None


async def test_a_conversation_turn_refuses_what_a_completion_refuses(http: httpx.AsyncClient) -> None:
    conversation = await create(http)
    url = f"/v1/conversations/{conversation['id']}/messages"
    for body, param in (
        ({"content": "hi", "n": 2}, "n"),
        ({"content": "hi", "audio": {"voice": "alloy"}}, "audio"),
        ({"content": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages"),
        ({"content": "hi", "top_k": 3}, "top_k"),
    ):
        resp = await http.post(url, json=body, headers=AUTH)
        assert resp.status_code == 400, body
        assert resp.json()["error"]["param"] == param
