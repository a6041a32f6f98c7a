"""A Responses stream survives its region's death as a chat stream does:
the zone peer continues the turn and the client's events carry every token
exactly once (the harness of :mod:`tests.edge.test_failover`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.edge.test_failover import MAX_TOKENS, PROMPT, K, auth, baseline, mesh_of, regions

pytestmark = pytest.mark.asyncio


async def test_a_responses_stream_loses_no_token_when_its_region_dies(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        _, secret = await mesh.new_key("us")
        body = {
            "model": "auto",
            "input": PROMPT,
            "max_output_tokens": MAX_TOKENS,
            "stream": True,
            "store": False,
        }
        events: list[dict[str, object]] = []
        async with (
            httpx.AsyncClient(base_url=mesh.url, timeout=60) as http,
            http.stream("POST", "/v1/responses", json=body, headers=auth(secret)) as resp,
        ):
            assert resp.status_code == 200, await resp.aread()
            serving = resp.headers["x-llmmesh-region"]
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                deltas = [e for e in events if e["type"] == "response.output_text.delta"]
                if len(deltas) == K and events[-1]["type"] == "response.output_text.delta":
                    await mesh.kill(serving)
    assert serving == "us-east"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    streamed = "".join(str(e["delta"]) for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert isinstance(final, dict)
    assert streamed == text == final["output"][0]["content"][0]["text"]
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (prompt_tokens, output_tokens)
