"""The edge's HTTP routes over an in-process mesh."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from llmmesh.globalplane.region_directory import RegionHealth
from tests.edge.sse import Event, parse_events
from tests.stack import DEV_KEY, Stack, wait_until

pytestmark = pytest.mark.asyncio
AUTH = {"authorization": f"Bearer {DEV_KEY}"}
BODY = {"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 10}


async def test_stream_ids_are_increasing_and_end_with_done(http: httpx.AsyncClient) -> None:
    # Event ids are opted into (by default a stream is framed as OpenAI's, with none).
    resp = await http.post(
        "/v1/chat/completions",
        json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
        headers={**AUTH, "x-llmmesh-event-ids": "true"},
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["x-llmmesh-region"] == "us-east"
    events = parse_events(resp.text)
    assert events[-1] == Event(None, "[DONE]")
    ids = [e.id for e in events[:-1] if e.id is not None]
    assert len(ids) == len(events) - 1
    assert ids == sorted(set(ids))
    chunks = [e.json() for e in events[:-1]]
    assert {c["id"] for c in chunks} == {resp.headers["x-request-id"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_models_needs_a_key(http: httpx.AsyncClient) -> None:
    assert (await http.get("/v1/models")).status_code == 401
    listed = (await http.get("/v1/models", headers=AUTH)).json()
    models = {m["id"]: m for m in listed["data"]}
    # The chat model and the embedding model the catalog starts with.
    assert set(models) == {"llmmesh-tiny", "llmmesh-tiny-embed"}
    assert models["llmmesh-tiny"]["context_window"] > 0
    assert (models["llmmesh-tiny"]["kind"], models["llmmesh-tiny-embed"]["kind"]) == ("chat", "embedding")


async def test_metrics_count_requests_and_tokens(http: httpx.AsyncClient) -> None:
    await http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=AUTH)
    text = (await http.get("/metrics")).text
    assert 'llmmesh_edge_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert "llmmesh_edge_output_tokens_total" in text


async def test_healthz_fails_when_the_engine_is_gone(stack: Stack, http: httpx.AsyncClient) -> None:
    await wait_until(lambda: stack.global_plane.directory.status("us-east") is not None, what="heartbeat")
    assert (await http.get("/healthz")).status_code == 200
    await stack.engine.stop(0)
    await wait_until(lambda: not stack.region.pool.healthy_pods, what="engine marked down")
    resp = await http.get("/healthz")
    assert resp.status_code == 503
    assert resp.json()["regions"]["us-east"]["healthy_engine_pods"] == 0
    # Once the directory hears the region is down, the zone has nowhere to send it.
    assert await stack.region.heartbeat.beat()
    status = stack.global_plane.directory.status("us-east")
    assert status is not None and status.effective_health == RegionHealth.DOWN
    refused = await http.post("/v1/chat/completions", json=BODY, headers=AUTH)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "no_region_in_zone"


async def test_usage_grows_by_what_a_turn_streamed(stack: Stack, http: httpx.AsyncClient) -> None:
    before = (await http.get("/v1/usage", headers=AUTH)).json()
    done = (await http.post("/v1/chat/completions", json=BODY, headers=AUTH)).json()
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10), "usage not delivered"
    after = (await http.get("/v1/usage", headers=AUTH)).json()
    assert after["output_tokens"] - before["output_tokens"] == done["usage"]["completion_tokens"]
    assert after["input_tokens"] - before["input_tokens"] == done["usage"]["prompt_tokens"]
    assert after["requests"] - before["requests"] == 1
    assert Decimal(after["cost_usd"]) > Decimal(before["cost_usd"])


async def test_usage_rejects_a_malformed_period(http: httpx.AsyncClient) -> None:
    resp = await http.get("/v1/usage", params={"period": "last-month"}, headers=AUTH)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "period"
