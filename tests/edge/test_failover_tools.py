"""Failover in the middle of a tool call: the region serving a streamed
reply of tool calls is killed after a few fragments, its zone peer goes on,
and the client (the official ``openai`` SDK) assembles the same valid calls,
with the same ids, as a reply served without a failure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionToolParam

from tests.edge.sdk import function_tool, object_schema
from tests.edge.test_failover import mesh_of, regions

pytestmark = pytest.mark.asyncio
TOOLS: list[ChatCompletionToolParam] = [
    function_tool("get_weather", object_schema(city={"type": "string"}, days={"type": "integer"}))
]
REQUEST: dict[str, Any] = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Weather for the week in Oslo?"}],
    "tools": TOOLS,
    "tool_choice": "required",
    "max_tokens": 300,
    "stream": True,
}
# Tool-call fragments read before the serving region is killed.
K = 3


async def streamed_calls(
    client: openai.AsyncOpenAI, kill: Any = None
) -> tuple[str, list[dict[str, str]], str]:
    """(serving region, the assembled calls, the finish reason); with ``kill``,
    the serving region is killed after ``K`` fragments."""
    calls: dict[int, dict[str, str]] = {}
    fragments = 0
    finish = ""
    async with client.chat.completions.with_streaming_response.create(**REQUEST) as response:
        serving = response.headers["x-llmmesh-region"]
        async for chunk in await response.parse():
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            for part in chunk.choices[0].delta.tool_calls or []:
                assert part.function is not None
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                if part.id:
                    assert not call["id"], "a call is named once"
                    call["id"], call["name"] = part.id, part.function.name or ""
                call["arguments"] += part.function.arguments or ""
                fragments += 1
                if fragments == K and kill is not None:
                    await kill(serving)
    return serving, [calls[i] for i in sorted(calls)], finish


def continued_failovers(metrics: str) -> float:
    found = re.search(r'^llmmesh_edge_failovers_total\{outcome="continued"\} (\S+)$', metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_a_failover_mid_tool_call_keeps_the_calls_whole(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, secret = await mesh.new_key("us")
        client = openai.AsyncOpenAI(base_url=f"{mesh.url}/v1", api_key=secret, max_retries=0, timeout=60)
        _, reference, _ = await streamed_calls(client)
        async with httpx.AsyncClient(base_url=mesh.url, timeout=30) as http:
            before = continued_failovers((await http.get("/metrics")).text)
            serving, calls, finish = await streamed_calls(client, kill=mesh.kill)
            after = continued_failovers((await http.get("/metrics")).text)
        await client.close()
    assert after == before + 1
    assert serving == "us-east" and finish == "tool_calls"
    assert len(reference[0]["arguments"]) > K, "the call is too short to break in the middle"
    assert [(c["name"], c["arguments"]) for c in calls] == [(c["name"], c["arguments"]) for c in reference]
    for call in calls:
        assert call["id"].startswith("call_")
        arguments = json.loads(call["arguments"])
        assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)
