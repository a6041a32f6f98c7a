"""A stream's framing: byte-compatible with OpenAI by default (``data:``
lines only, ``data: [DONE]`` last), so a parser that strips only a leading
``data: `` (as vLLM's ``bench serve`` does) reads it; event ids for a
client that opts in; and a resume by the count of events a client kept
without ids. One mesh for the module: no test reads what another leaves."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.edge.sse import parse_events
from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio(loop_scope="module")
AUTH = {"authorization": f"Bearer {DEV_KEY}"}
BODY: dict[str, Any] = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Tell me about framing."}],
    "max_tokens": 12,
    "seed": 4,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def naive_chunks(body: bytes) -> list[dict[str, Any]]:
    """The chunks as vLLM's benchmark client reads them: split on blank
    lines, strip a leading ``data: ``, stop at ``[DONE]``, decode JSON."""
    chunks: list[dict[str, Any]] = []
    for part in body.split(b"\n\n"):
        text = part.strip().decode().removeprefix("data: ")
        if not text:
            continue
        if text == "[DONE]":
            return chunks
        chunks.append(json.loads(text))
    raise AssertionError("no [DONE]")


async def test_the_default_stream_is_openais_framing(shared_http: httpx.AsyncClient) -> None:
    resp = await shared_http.post("/v1/chat/completions", json=BODY, headers=AUTH)
    assert resp.status_code == 200
    lines = [line for line in resp.content.split(b"\n") if line]
    assert all(line.startswith(b"data: ") for line in lines) and lines[-1] == b"data: [DONE]"
    assert resp.content.endswith(b"data: [DONE]\n\n")
    chunks = naive_chunks(resp.content)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = await shared_http.post(
        "/v1/chat/completions", json={**BODY, "stream": False, "stream_options": None}, headers=AUTH
    )
    assert text == whole.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("header", ["x-llmmesh-event-ids", "x-llmmesh-resumable"])
async def test_a_client_opts_into_event_ids(shared_http: httpx.AsyncClient, header: str) -> None:
    resp = await shared_http.post("/v1/chat/completions", json=BODY, headers={**AUTH, header: "true"})
    events = parse_events(resp.text)
    assert [e.id for e in events] == [*range(len(events) - 1), None] and events[-1].data == "[DONE]"


async def test_a_resume_by_count_needs_no_ids(shared_http: httpx.AsyncClient) -> None:
    resp = await shared_http.post("/v1/chat/completions", json=BODY, headers=AUTH)
    events = parse_events(resp.text)
    stream_id = resp.headers["x-request-id"]
    # A client that kept 3 events (and no ids) asks for those after the third, numbered 2.
    resumed = await shared_http.get(f"/v1/streams/{stream_id}", params={"starting_after": "2"}, headers=AUTH)
    assert resumed.status_code == 200
    assert parse_events(resumed.text) == events[3:]
    assert b"id:" not in resumed.content
    # Resuming by Last-Event-ID, an SSE client gets ids again.
    by_id = await shared_http.get(f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": "2"})
    assert [e.id for e in parse_events(by_id.text)] == [*range(3, len(events) - 1), None]


async def test_a_replayed_conversation_turn_is_framed_as_asked(shared_http: httpx.AsyncClient) -> None:
    conversation = (await shared_http.post("/v1/conversations", json={}, headers=AUTH)).json()["id"]
    path = f"/v1/conversations/{conversation}/messages"
    turn = {"content": "Say hi.", "max_tokens": 6, "stream": True, "client_message_id": "framing-1"}
    first = await shared_http.post(path, json=turn, headers=AUTH)
    assert first.status_code == 200 and b"id:" not in first.content
    again = await shared_http.post(path, json=turn, headers=AUTH)
    assert again.headers["x-llmmesh-replayed"] == "true" and b"id:" not in again.content
    with_ids = await shared_http.post(path, json=turn, headers={**AUTH, "x-llmmesh-event-ids": "true"})
    events = parse_events(with_ids.text)
    assert [e.id for e in events] == [*range(len(events) - 1), None]
    assert [e.data for e in events] == [e.data for e in parse_events(again.text)]
