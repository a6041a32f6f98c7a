"""The OpenAI-compatible streaming client against canned server-sent events."""

from __future__ import annotations

import json

import httpx
import pytest

from llmmesh.bench.openai_client import ChunkCounter, OpenAIChatClient, chat_body
from llmmesh.bench.workload import ChatWorkload

REQUEST = ChatWorkload().requests("c1", 1, 3)[0]


def _sse(*chunks: dict[str, object], done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def _chunk(content: str | None, completion_tokens: int | None) -> dict[str, object]:
    chunk: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": content}}]}
    if completion_tokens is not None:
        chunk["usage"] = {"prompt_tokens": 40, "completion_tokens": completion_tokens}
    return chunk


def test_the_body_asks_for_a_greedy_stream_with_usage() -> None:
    body = chat_body("llmmesh-tiny", REQUEST)
    assert body["messages"] == [
        {"role": "system", "content": REQUEST.system},
        {"role": "user", "content": REQUEST.user},
    ]
    assert body["max_tokens"] == 3
    assert body["temperature"] == 0
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "ignore_eos" not in chat_body("llmmesh-tiny", REQUEST, ignore_eos=False)


def test_chunk_counter_uses_running_usage() -> None:
    counter = ChunkCounter()
    assert counter.tokens_in(_chunk("", 0)) == 0  # the role chunk
    assert counter.tokens_in(_chunk("a", 1)) == 1
    assert counter.tokens_in(_chunk("", 2)) == 1  # text held back, a token all the same
    assert counter.tokens_in(_chunk("bc", 4)) == 2
    assert counter.tokens_in({"choices": [], "usage": {"completion_tokens": 4}}) == 0  # the usage chunk


def test_chunk_counter_falls_back_to_content_chunks() -> None:
    counter = ChunkCounter()
    assert counter.tokens_in(_chunk("a", None)) == 1
    assert counter.tokens_in(_chunk("", None)) == 0


def _client(handler: httpx.MockTransport) -> OpenAIChatClient:
    return OpenAIChatClient("http://peer", "llmmesh-tiny", 4, 10.0, transport=handler)


@pytest.mark.asyncio
async def test_a_stream_is_timed_token_by_token() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        body = _sse(_chunk("", 0), _chunk("a", 1), _chunk("b", 2), _chunk("c", 3))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = _client(httpx.MockTransport(handler))
    try:
        record = await client.generate(REQUEST)
    finally:
        await client.close()
    assert record.ok
    assert record.output_tokens == 3
    assert len(record.chunks) == 3
    assert bodies[0]["model"] == "llmmesh-tiny"


@pytest.mark.asyncio
async def test_an_error_status_is_a_failed_request() -> None:
    client = _client(httpx.MockTransport(lambda request: httpx.Response(400, text="bad request")))
    try:
        record = await client.generate(REQUEST)
    finally:
        await client.close()
    assert record.error == "HTTP 400: bad request"


@pytest.mark.asyncio
async def test_a_stream_cut_short_is_a_failed_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse(_chunk("a", 1), done=False))

    client = _client(httpx.MockTransport(handler))
    try:
        record = await client.generate(REQUEST)
    finally:
        await client.close()
    assert record.output_tokens == 1
    assert record.error == "the stream ended without data: [DONE]"
