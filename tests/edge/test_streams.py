"""The edge's streams: OpenAI's SSE conventions, resuming after a dropped
connection (in-process and across two edges sharing Redis), cancellation
by request and by disconnect, and readers that cannot hold up producers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llmmesh.edge.chunks import ChunkStream
from llmmesh.edge.server import EdgeServer, start_edge
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.log import EventsGone, InProcessStreamLog, LogEntry, StreamInfo
from llmmesh.engine.sim.backend import SimBackend
from tests.edge.sse import Event, parse_events
from tests.stack import DEV_KEY, Stack, running_stack, wait_until

pytestmark = pytest.mark.asyncio
AUTH = {"authorization": f"Bearer {DEV_KEY}"}
RESUMABLE = {"x-llmmesh-resumable": "true"}
# Event ids without detaching the stream from its connection.
EVENT_IDS = {"x-llmmesh-event-ids": "true"}
PROMPT = [{"role": "user", "content": "Tell me about resumable streams."}]
# Slow enough that a stream is still being produced when a test resumes it.
SLOW_POD: dict[str, Any] = {"sim_inter_token_s": 0.02}
# Every generation stops after three tokens and waits for an abort: a turn
# that only a cancel can end, so no test races the generation's natural end.
# No output filter, which would hold those tokens back (it releases text
# only once what follows has been checked with it): each comes as a delta.
STALLED_POD: dict[str, Any] = {"sim_stall_after_tokens": 3}
UNFILTERED = {"safety_backends": "none"}


def data(events: list[Event]) -> list[str]:
    """The events' data, whatever their framing."""
    return [e.data for e in events]


def texts(events: list[Event]) -> list[str]:
    """Each chunk's delta text, or finish reason, or usage, without ids."""
    return [text for _, text in content(events)]


def content(events: list[Event]) -> list[tuple[int | None, str]]:
    """Each chunk's id and delta text, or its finish reason, or its usage."""
    out: list[tuple[int | None, str]] = []
    for event in events:
        if event.data == "[DONE]":
            out.append((None, "[DONE]"))
            continue
        chunk = event.json()
        if not chunk["choices"]:
            out.append((event.id, f"usage {chunk['usage']['completion_tokens']}"))
            continue
        choice = chunk["choices"][0]
        out.append((event.id, choice["finish_reason"] or choice["delta"].get("content", "")))
    return out


async def read_stream(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    limit: int | None = None,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> tuple[httpx.Response, list[Event]]:
    """Read SSE events until the end, or only ``limit`` of them and then drop
    the connection."""
    events: list[Event] = []
    async with client.stream(method, url, headers={**AUTH, **(headers or {})}, **kwargs) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp, events
        block: list[str] = []
        async for line in resp.aiter_lines():
            if line:
                block.append(line)
                continue
            if block:
                events.extend(parse_events("\n".join(block)))
                block = []
            if limit is not None and len(events) >= limit:
                break
    return resp, events


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": PROMPT, "stream": True, **extra}


def sim(stack: Stack) -> SimBackend:
    backend = stack.engine.backend
    assert isinstance(backend, SimBackend)
    return backend


async def usage_totals(client: httpx.AsyncClient, stack: Stack) -> dict[str, Any]:
    """The dev tenant's billed usage once every finished turn is delivered."""
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10), "usage not delivered"
    totals: dict[str, Any] = (await client.get("/v1/usage", headers=AUTH)).json()
    return totals


@asynccontextmanager
async def edge_on(stack: Stack, **settings: Any) -> AsyncIterator[tuple[EdgeServer, httpx.AsyncClient]]:
    """An edge of ``stack``'s mesh with ``settings``, and a client of it."""
    edge = await start_edge(
        EdgeSettings(
            port=0, global_address=stack.global_plane.address, auth_cache_ms=0, insecure=True, **settings
        )
    )
    try:
        async with httpx.AsyncClient(base_url=edge.url, timeout=30) as client:
            yield edge, client
    finally:
        await edge.stop()


@pytest_asyncio.fixture
async def slow() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    async with running_stack(with_edge=True, **SLOW_POD) as stack:
        assert stack.edge is not None
        async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
            yield stack, client


@pytest_asyncio.fixture
async def stalled() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    async with (
        running_stack(region_overrides=UNFILTERED, **STALLED_POD) as stack,
        edge_on(stack, detached_timeout_ms=500) as (_, client),
    ):
        yield stack, client


# ---------------------------------------------------------------- conventions


async def test_chunks_follow_openai_conventions(slow: tuple[Stack, httpx.AsyncClient]) -> None:
    _, client = slow
    resp, events = await read_stream(
        client, "POST", "/v1/chat/completions", json=body(stream_options={"include_usage": True})
    )
    assert resp.status_code == 200
    assert resp.headers["x-llmmesh-region"] == "us-east"
    assert events[-1] == Event(None, "[DONE]") and [e.data for e in events].count("[DONE]") == 1
    chunks = [e.json() for e in events[:-1]]
    assert {c["id"] for c in chunks} == {resp.headers["x-request-id"]}
    assert len({c["created"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    reasons = [c["choices"][0]["finish_reason"] for c in chunks[:-1]]
    assert reasons[:-1] == [None] * (len(reasons) - 1) and reasons[-1] in ("stop", "length")
    # A delta may carry several tokens (the region's output filter releases text in pieces).
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= len(chunks) - 3
    assert all(c["usage"] is None for c in chunks[:-1])
    # OpenAI's framing: no ids (an opted-in client's are in test_stream_framing).
    assert {e.id for e in events} == {None}


async def test_a_filtered_reply_ends_with_content_filter_and_its_categories() -> None:
    async with running_stack(with_edge=True) as probe:
        assert probe.edge is not None
        async with httpx.AsyncClient(base_url=probe.edge.url, timeout=30) as client:
            _, events = await read_stream(client, "POST", "/v1/chat/completions", json=body(seed=3))
    reply = "".join(text for _, text in content(events)[1:-2])
    words = [w for w in reply.split() if w.isalpha() and len(w) > 3]
    assert len(words) > 4, reply
    denied = words[len(words) // 2]
    async with (
        running_stack(region_overrides={"safety_deny_terms": f"violence={denied}"}) as stack,
        edge_on(stack) as (_, client),
    ):
        resp, events = await read_stream(client, "POST", "/v1/chat/completions", json=body(seed=3))
    assert resp.status_code == 200
    assert events[-1].data == "[DONE]"
    finish = events[-2].json()["choices"][0]
    assert finish["finish_reason"] == "content_filter"
    assert finish["content_filter_results"] == {"violence": {"filtered": True}}
    streamed = "".join(text for _, text in content(events)[1:-2])
    assert denied not in streamed.split() and reply.startswith(streamed)


async def test_an_error_mid_stream_is_an_error_event_and_no_done() -> None:
    async with running_stack(with_edge=True, sim_error_rate=1.0) as stack:
        assert stack.edge is not None
        async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
            resp, events = await read_stream(
                client, "POST", "/v1/chat/completions", json=body(), headers=EVENT_IDS
            )
    assert resp.status_code == 200
    assert "[DONE]" not in [e.data for e in events]
    error = events[-1].json()["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_failed"
    ids = [e.id for e in events]
    assert ids == list(range(len(events)))  # the error event carries the next id


async def test_curl_streams_and_resumes(slow: tuple[Stack, httpx.AsyncClient]) -> None:
    stack, _ = slow
    assert stack.edge is not None

    async def curl(*args: str) -> tuple[str, str]:
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-N", "-D", "-", "-H", f"Authorization: Bearer {DEV_KEY}", *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(60):
            out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        head, _, text = out.decode().replace("\r\n", "\n").partition("\n\n")
        return head, text

    head, text = await curl(
        "-H", "Content-Type: application/json", "-d", json.dumps(body()),
        f"{stack.edge.url}/v1/chat/completions",
    )  # fmt: skip
    assert "text/event-stream" in head
    events = parse_events(text)
    assert events[-1].data == "[DONE]" and {e.id for e in events} == {None}
    stream_id = events[0].json()["id"]
    # An SSE client resuming by Last-Event-ID gets ids (the events are numbered from 0 all the same).
    _, resumed = await curl("-H", "Last-Event-ID: 2", f"{stack.edge.url}/v1/streams/{stream_id}")
    assert data(parse_events(resumed)) == data(events[3:])
    assert [e.id for e in parse_events(resumed)][:-1] == list(range(3, len(events) - 1))


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("via", ["Last-Event-ID", "starting_after"])
async def test_a_resume_after_a_drop_gets_exactly_the_missing_events(
    slow: tuple[Stack, httpx.AsyncClient], via: str
) -> None:
    _, client = slow
    request = body(stream_options={"include_usage": True})
    _, whole = await read_stream(client, "POST", "/v1/chat/completions", json=request)
    assert len(whole) > 8
    resp, first = await read_stream(
        client, "POST", "/v1/chat/completions", json=request, limit=5, headers=RESUMABLE
    )
    stream_id = resp.headers["x-request-id"]
    last = first[-1].id
    assert last == 4
    params, headers = (
        ({"starting_after": str(last)}, {}) if via == "starting_after" else ({}, {via: str(last)})
    )
    resp, rest = await read_stream(client, "GET", f"/v1/streams/{stream_id}", params=params, headers=headers)
    assert resp.status_code == 200 and resp.headers["x-request-id"] == stream_id
    assert texts(first + rest) == texts(whole)
    assert [e.data for e in first + rest].count("[DONE]") == 1
    assert {e.json()["id"] for e in first + rest if e.data != "[DONE]"} == {stream_id}
    # Ids on a resume by Last-Event-ID; OpenAI's framing on one by count.
    assert {e.id for e in rest[:-1]} == ({None} if via == "starting_after" else set(range(5, len(whole) - 1)))
    # The whole stream stays replayable from the start.
    _, again = await read_stream(client, "GET", f"/v1/streams/{stream_id}")
    assert data(again) == data(first + rest)


async def test_resume_refuses_other_keys_unknown_ids_and_bad_positions(
    slow: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, client = slow
    tenant, _ = await stack.global_plane.tenants.authenticate(DEV_KEY)
    _, other_secret = await stack.global_plane.tenants.create_api_key(tenant.id)
    other = {"authorization": f"Bearer {other_secret}"}
    resp, events = await read_stream(client, "POST", "/v1/chat/completions", json=body())
    stream_id = resp.headers["x-request-id"]
    for method, url in (("GET", f"/v1/streams/{stream_id}"), ("POST", f"/v1/streams/{stream_id}/cancel")):
        refused = await client.request(method, url, headers=other)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "stream_not_found"
    unknown = await client.get("/v1/streams/chatcmpl-unknown", headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "stream_not_found"
    assert (await client.get(f"/v1/streams/{stream_id}")).status_code == 401
    for params, headers in (
        ({"starting_after": "x"}, {}),
        ({"starting_after": "-1"}, {}),
        ({}, {"Last-Event-ID": "1.5"}),
    ):
        bad = await client.get(f"/v1/streams/{stream_id}", params=params, headers={**AUTH, **headers})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] in ("starting_after", "Last-Event-ID")
    # The owner still can; after the end there is only [DONE].
    _, tail = await read_stream(client, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "999"})
    assert tail == [Event(None, "[DONE]")]
    cancel = await client.post(f"/v1/streams/{stream_id}/cancel", headers=AUTH)
    assert cancel.json() == {"id": stream_id, "object": "stream.cancel", "status": "already_finished"}
    assert events[-1].data == "[DONE]"


async def test_a_resume_on_another_edge_sharing_redis_gets_the_missing_events(redis_url: str) -> None:
    async with (
        running_stack(**SLOW_POD) as stack,
        edge_on(stack, redis_url=redis_url) as (_, edge_a),
        edge_on(stack, redis_url=redis_url) as (_, edge_b),
    ):
        _, whole = await read_stream(edge_a, "POST", "/v1/chat/completions", json=body())
        resp, first = await read_stream(
            edge_a, "POST", "/v1/chat/completions", json=body(), limit=4, headers=RESUMABLE
        )
        stream_id = resp.headers["x-request-id"]
        resp, rest = await read_stream(
            edge_b, "GET", f"/v1/streams/{stream_id}", headers={"Last-Event-ID": str(first[-1].id)}
        )
        assert resp.status_code == 200 and resp.headers["x-llmmesh-region"] == "us-east"
        assert texts(first + rest) == texts(whole)
        assert [e.data for e in rest].count("[DONE]") == 1
        _, again = await read_stream(
            edge_b, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "2"}
        )
        assert data(again) == data((first + rest)[3:])


# ---------------------------------------------------------------- cancel


async def test_cancel_aborts_the_engine_request_and_bills_what_was_streamed(
    stalled: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, client = stalled
    before = await usage_totals(client, stack)
    request = body(stream_options={"include_usage": True})
    async with client.stream("POST", "/v1/chat/completions", json=request, headers=AUTH) as resp:
        stream_id = resp.headers["x-request-id"]
        lines = resp.aiter_lines()
        seen: list[str] = []
        while len([s for s in seen if s.startswith("data: ")]) < 4:  # role and the three tokens
            seen.append(await anext(lines))
        assert sim(stack).scheduler.running == 1
        cancel = await client.post(f"/v1/streams/{stream_id}/cancel", headers=AUTH)
        assert cancel.status_code == 200
        assert cancel.json() == {"id": stream_id, "object": "stream.cancel", "status": "cancelled"}
        rest = [line async for line in lines]
    await wait_until(lambda: sim(stack).scheduler.running == 0, what="engine request aborted")
    events = parse_events("\n".join(seen + rest))
    assert events[-1].data == "[DONE]"
    assert events[-3].json()["choices"][0]["finish_reason"] == "cancelled"
    usage = events[-2].json()["usage"]
    assert usage["completion_tokens"] == 3
    after = await usage_totals(client, stack)
    assert after["output_tokens"] - before["output_tokens"] == 3
    assert after["input_tokens"] - before["input_tokens"] == usage["prompt_tokens"]
    again = await client.post(f"/v1/streams/{stream_id}/cancel", headers=AUTH)
    assert again.json()["status"] == "already_finished"


async def test_cancel_stops_the_usage_from_growing(slow: tuple[Stack, httpx.AsyncClient]) -> None:
    stack, client = slow
    request = body(stream_options={"include_usage": True})
    _, whole = await read_stream(client, "POST", "/v1/chat/completions", json=request)
    full = whole[-2].json()["usage"]["completion_tokens"]
    before = await usage_totals(client, stack)
    resp, _first = await read_stream(
        client, "POST", "/v1/chat/completions", json=request, limit=3, headers=RESUMABLE
    )
    stream_id = resp.headers["x-request-id"]
    cancel = await client.post(f"/v1/streams/{stream_id}/cancel", headers=AUTH)
    assert cancel.json()["status"] == "cancelled"
    _, rest = await read_stream(client, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "2"})
    usage = rest[-2].json()["usage"]
    assert usage["completion_tokens"] < full
    after = await usage_totals(client, stack)
    assert after["output_tokens"] - before["output_tokens"] == usage["completion_tokens"]
    assert Decimal(after["cost_usd"]) > Decimal(before["cost_usd"])


async def test_a_cancel_on_another_edge_reaches_the_producing_edge(redis_url: str) -> None:
    async with (
        running_stack(region_overrides=UNFILTERED, **STALLED_POD) as stack,
        edge_on(stack, redis_url=redis_url) as (_, edge_a),
        edge_on(stack, redis_url=redis_url) as (_, edge_b),
    ):
        resp, _first = await read_stream(
            edge_a, "POST", "/v1/chat/completions", json=body(), limit=4, headers=RESUMABLE
        )
        stream_id = resp.headers["x-request-id"]
        assert sim(stack).scheduler.running == 1
        tenant, _ = await stack.global_plane.tenants.authenticate(DEV_KEY)
        _, other_secret = await stack.global_plane.tenants.create_api_key(tenant.id)
        refused = await edge_b.post(
            f"/v1/streams/{stream_id}/cancel", headers={"authorization": f"Bearer {other_secret}"}
        )
        assert refused.status_code == 404
        cancel = await edge_b.post(f"/v1/streams/{stream_id}/cancel", headers=AUTH)
        assert cancel.json()["status"] == "cancelled"
        await wait_until(lambda: sim(stack).scheduler.running == 0, what="engine request aborted")
        _, rest = await read_stream(edge_b, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "3"})
        assert [text for _, text in content(rest)] == ["cancelled", "[DONE]"]


# ---------------------------------------------------------------- disconnects


async def test_a_client_disconnect_aborts_the_engine_request(
    stalled: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, client = stalled
    resp, _first = await read_stream(client, "POST", "/v1/chat/completions", json=body(), limit=2)
    await wait_until(lambda: sim(stack).scheduler.running == 0, what="engine request aborted")
    # The log still tells how the stream ended.
    _, rest = await read_stream(
        client,
        "GET",
        f"/v1/streams/{resp.headers['x-request-id']}",
        params={"starting_after": "1"},
        headers=EVENT_IDS,
    )
    assert [text for _, text in content(rest)][-2:] == ["cancelled", "[DONE]"]
    assert [e.id for e in rest][:-1] == list(range(2, len(rest) + 1))


async def test_a_disconnect_during_a_non_streamed_request_aborts_it(
    stalled: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, client = stalled
    request = asyncio.create_task(
        client.post("/v1/chat/completions", json={**body(), "stream": False}, headers=AUTH)
    )
    await wait_until(lambda: sim(stack).scheduler.running == 1, what="generation running")
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    await wait_until(lambda: sim(stack).scheduler.running == 0, what="engine request aborted")


async def test_a_detached_stream_outlives_its_client_until_nobody_reads_it(
    stalled: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, client = stalled
    resp, _first = await read_stream(
        client, "POST", "/v1/chat/completions", json=body(), limit=2, headers=RESUMABLE
    )
    stream_id = resp.headers["x-request-id"]
    # Reconnect and read on: the turn was not cancelled by the drop.
    resp, more = await read_stream(
        client, "GET", f"/v1/streams/{stream_id}", headers={"Last-Event-ID": "1"}, limit=2
    )
    assert [e.id for e in more] == [2, 3]
    # Nobody reads it any more: detached_timeout_ms later it is cancelled.
    await wait_until(lambda: sim(stack).scheduler.running == 0, timeout_s=20, what="unread stream cancelled")
    _, rest = await read_stream(client, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "3"})
    assert [text for _, text in content(rest)] == ["cancelled", "[DONE]"]


# ---------------------------------------------------------------- backpressure


async def test_an_unread_stream_holds_up_no_other_and_its_log_stays_bounded() -> None:
    async with (
        running_stack(region_overrides=UNFILTERED, **SLOW_POD) as stack,
        edge_on(stack, stream_log_max_events=8) as (_, client),
        client.stream("POST", "/v1/chat/completions", json=body(), headers={**AUTH, **RESUMABLE}) as idle,
    ):
        stream_id = idle.headers["x-request-id"]
        # Its client reads nothing while another stream runs to its end...
        _, other = await read_stream(
            client, "POST", "/v1/chat/completions", json=body(seed=1, temperature=1.0)
        )
        assert other[-1].data == "[DONE]" and len(other) > 10
        # ...and so does the unread one: following it from past its end
        # waits for the end and gets only [DONE].
        _, end = await read_stream(
            client, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "1000000"}
        )
        assert end == [Event(None, "[DONE]")]
        # Its log holds only the last eight entries (of a dozen or more,
        # one token a delta): a reader that far behind is told the start is gone.
        _, tail = await read_stream(client, "GET", f"/v1/streams/{stream_id}", params={"starting_after": "0"})
        assert [e.id for e in tail] == [None]
        assert tail[0].json()["error"]["code"] == "stream_events_expired"


async def test_a_slow_reader_never_blocks_the_producer_and_memory_stays_bounded() -> None:
    log = InProcessStreamLog(max_events=16, max_streams=4, retention_s=60, reader_grace_s=1)
    await log.open("s", StreamInfo("key", "tenant", "region"))
    chunks = ChunkStream("s", 0, "m", include_usage=False)
    reader = log.follow("s", -1)
    await log.append("s", LogEntry(0, -1, chunks.role().frame))
    assert (await anext(reader)).event_id == 0
    # The reader stops reading; the producer appends a thousand events without waiting.
    for sequence in range(1, 1001):
        await log.append("s", LogEntry(sequence, sequence - 1, chunks.content(sequence, "x").frame))
        assert log.held("s") <= 16
    await log.append("s", LogEntry(1000, 1000, b"data: [DONE]\n\n", end=True))
    with pytest.raises(EventsGone):
        await anext(reader)
    # A reader within what is held gets the rest and the end.
    tail = [entry async for entry in log.follow("s", 990)]
    assert [e.event_id for e in tail] == [*range(991, 1001), 1000] and tail[-1].end


async def test_the_in_process_log_forgets_finished_streams_beyond_its_bounds() -> None:
    now = [0.0]
    log = InProcessStreamLog(
        max_events=4, max_streams=2, retention_s=10, reader_grace_s=1, clock=lambda: now[0]
    )
    for name in ("a", "b", "c"):
        await log.open(name, StreamInfo("key", "tenant", "region"))
        await log.append(name, LogEntry(0, -1, b"x"))
    await log.append("a", LogEntry(0, 0, b"", end=True))
    await log.append("b", LogEntry(0, 0, b"", end=True))
    assert log.streams() == 3
    await log.append("c", LogEntry(0, 0, b"", end=True))
    assert log.streams() == 2 and await log.info("a") is None  # the oldest finished one went first
    now[0] = 11.0
    assert log.streams() == 0
    with pytest.raises(EventsGone):
        await anext(log.follow("c", -1))


async def test_an_unreachable_redis_leaves_streams_unresumable_and_refuses_resumes() -> None:
    async with running_stack() as stack, edge_on(stack, redis_url="redis://127.0.0.1:1/0") as (_, client):
        resp, events = await read_stream(client, "POST", "/v1/chat/completions", json=body())
        assert resp.status_code == 200 and events[-1].data == "[DONE]"
        assert resp.headers["x-llmmesh-resumable"] == "false"
        refused = await client.get("/v1/streams/chatcmpl-x", headers=AUTH)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "stream_log_unavailable"
        whole = await client.post("/v1/chat/completions", json={**body(), "stream": False}, headers=AUTH)
        assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"]
