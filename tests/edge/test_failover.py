"""Mid-stream failover at the edge, on an in-process multi-region mesh
(zone ``us``: us-east and us-west; zone ``eu``: eu-west and eu-central).

A region is killed (its gRPC server stopped at once) or stalls (its pod
stops producing, the stream stays open) or is cut off (a TCP hop that stops
forwarding) in the middle of a streamed turn: the client's stream goes on
from the zone peer with every token exactly once, compared with the same
greedy turn served without a failure (the simulator's reply depends only on
the prompt and sampling), and the turn is billed once. A failover never
leaves the zone, and a resume after one gets the right events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import sqlalchemy as sa

from llmmesh.core.grpcserver import open_channel
from llmmesh.edge.schemas import parse_chat_request
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.region.zone_store import schema
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc
from tests.edge.sse import Event, events_of
from tests.multiregion import MultiRegionMesh, RegionSpec, running_multiregion
from tests.stack import wait_until

pytestmark = pytest.mark.asyncio

# Slow enough that a turn is still generating when a test breaks its region.
SLOW: dict[str, object] = {"sim_inter_token_s": 0.02}
PROMPT = "Tell me how a stream survives the loss of its region."
MAX_TOKENS = 48
# Content events read before the region is broken.
K = 3


def regions(us_east_engine: dict[str, object] | None = None) -> list[RegionSpec]:
    return [
        RegionSpec("us-east", "us", engine={**SLOW, **(us_east_engine or {})}),
        RegionSpec("us-west", "us", engine=SLOW),
        RegionSpec("eu-west", "eu", engine=SLOW),
        RegionSpec("eu-central", "eu", engine=SLOW),
    ]


@contextlib.asynccontextmanager
async def mesh_of(tmp_path: Path, specs: list[RegionSpec], **edge: object) -> AsyncIterator[MultiRegionMesh]:
    # Kills break the stream at once; the stall watchdog stays for the test
    # that stalls a region, so a loaded machine's slow step is no failover.
    edge.setdefault("stall_timeout_ms", 15_000)
    async with running_multiregion(specs, store_dir=tmp_path, edge=edge) as mesh:
        yield mesh


def body(*, stream: bool = True) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": "auto",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }
    if stream:
        request["stream_options"] = {"include_usage": True}
    return request


# The drills check the stream's event ids, which a client opts into.
EVENT_IDS = {"x-llmmesh-event-ids": "true"}


def auth(secret: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}", **extra}


@dataclass
class Streamed:
    """A streamed completion as the client read it."""

    region: str
    events: list[Event]

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e.json() for e in self.events if e.data != "[DONE]"]

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c.get("choices"))

    @property
    def usage(self) -> dict[str, Any]:
        usages = [c["usage"] for c in self.chunks if c.get("usage")]
        assert len(usages) == 1, usages
        return cast(dict[str, Any], usages[0])

    def assert_one_whole_stream(self) -> None:
        """One role chunk, contiguous ids, one finish, one usage, one [DONE] last."""
        assert [e.data for e in self.events].count("[DONE]") == 1 and self.events[-1].data == "[DONE]"
        ids = [e.id for e in self.events[:-1]]
        assert ids == list(range(len(ids))), ids
        roles = [c for c in self.chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
        assert len(roles) == 1 and self.events[0].json()["choices"][0]["delta"]["role"] == "assistant"
        finishes = [c for c in self.chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finishes) == 1
        assert {c["id"] for c in self.chunks} == {self.chunks[0]["id"]}


async def stream(
    http: httpx.AsyncClient,
    secret: str,
    *,
    after_content: Callable[[str], Any] | None = None,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
) -> Streamed:
    """Stream the turn; after ``K`` content events await ``after_content(region)``;
    with ``stop_after``, leave after that many events."""
    async with http.stream(
        "POST", "/v1/chat/completions", json=body(), headers=auth(secret, **{**EVENT_IDS, **(headers or {})})
    ) as resp:
        assert resp.status_code == 200, await resp.aread()
        got = Streamed(resp.headers["x-llmmesh-region"], [])
        contents = 0
        async for event in events_of(resp.aiter_lines()):
            got.events.append(event)
            if event.data == "[DONE]" or (stop_after is not None and len(got.events) >= stop_after):
                break
            chunk = event.json()
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                contents += 1
                if contents == K and after_content is not None:
                    await after_content(got.region)
    return got


def settlements(metrics: str, outcome: str) -> float:
    """The edge's count of turns settled with ``outcome``; the process's, so compare increments."""
    line = f'llmmesh_edge_turn_settlements_total{{outcome="{outcome}"}} '
    return float(next(m for m in metrics.splitlines() if m.startswith(line)).split()[-1])


async def settle_billing(mesh: MultiRegionMesh, zone: str) -> None:
    """Every region of the zone has recorded and shipped what it ran."""
    for running in mesh.zone_regions(zone):
        for plane in [*running.dead, running.plane]:
            await plane.gateway.drain()
            assert await plane.shipper.flush(timeout_s=10), f"{plane.settings.region}: usage not shipped"


async def store_tokens(mesh: MultiRegionMesh, zone: str, tenant_id: str) -> int:
    return await mesh.store(zone).tenant_tokens(tenant_id, since=datetime(2000, 1, 1, tzinfo=UTC))


async def baseline(mesh: MultiRegionMesh, region: str, secret: str) -> tuple[str, int, int]:
    """The same turn served whole by ``region`` over gRPC: (text, prompt tokens, output tokens)."""
    request = parse_chat_request(body(stream=False))
    start = chat_service_pb2.ChatStart(
        model="llmmesh-tiny", messages=request.to_messages(), sampling=request.to_sampling()
    )
    async with open_channel(mesh.plane(region).address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
            metadata=(("authorization", f"Bearer {secret}"),)
        )
        await call.write(chat_service_pb2.ChatRequest(start=start))
        await call.done_writing()
        events = [event async for event in call]
    text = "".join(e.delta.text for e in events if e.HasField("delta"))
    usage = next(e.usage.usage for e in events if e.HasField("usage"))
    assert usage.output_tokens > K + 4, "the reply is too short to break in the middle"
    return text, usage.input_tokens, usage.output_tokens


async def assert_billed_once(
    mesh: MultiRegionMesh, zone: str, tenant_id: str, prompt_tokens: int, output_tokens: int
) -> None:
    await settle_billing(mesh, zone)
    assert await store_tokens(mesh, zone, tenant_id) == prompt_tokens + output_tokens
    billed = await mesh.global_plane.ledger.usage(tenant_id, "")
    assert (billed.input_tokens, billed.output_tokens) == (prompt_tokens, output_tokens)


async def test_a_killed_region_mid_stream_is_continued_by_its_zone_peer(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        tenant_id, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            settled_before = settlements((await http.get("/metrics")).text, "settled")
            got = await stream(http, secret, after_content=mesh.kill)
            # The continued turn is settled to what its client received, once it ended.
            async with asyncio.timeout(30):
                while settlements(metrics := (await http.get("/metrics")).text, "settled") <= settled_before:
                    await asyncio.sleep(0.1)
        assert 'llmmesh_edge_failovers_total{outcome="continued"}' in metrics
        assert got.region == "us-east"
        got.assert_one_whole_stream()
        assert got.text == text
        assert got.usage["prompt_tokens"] == prompt_tokens
        assert got.usage["completion_tokens"] == output_tokens
        assert got.chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        await assert_billed_once(mesh, "us", tenant_id, prompt_tokens, output_tokens)
        # The continuation has its own request id; the turn's rows are the stream's.
        stream_id = got.chunks[0]["id"]
        rows = await rows_of(mesh, "us", tenant_id)
        assert set(rows) == {stream_id, f"{stream_id}-r2"}


async def test_a_continuation_whose_region_dies_too_is_continued_again(tmp_path: Path) -> None:
    specs = [*regions()[:2], RegionSpec("us-central", "us", engine=SLOW)]
    async with mesh_of(tmp_path, specs) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        tenant_id, secret = await mesh.new_key("us")
        killed: list[str] = []

        async def continuing_region(stream_id: str) -> str:
            query = sa.select(schema.turn_starts.c.home_region).where(
                schema.turn_starts.c.tenant_id == tenant_id, schema.turn_starts.c.continues == stream_id
            )
            homes = await mesh.store("us").transaction(lambda conn: conn.execute(query).scalars().all())
            assert len(homes) == 1, homes
            return str(homes[0])

        async with (
            httpx.AsyncClient(base_url=mesh.url, timeout=60) as http,
            http.stream(
                "POST", "/v1/chat/completions", json=body(), headers=auth(secret, **EVENT_IDS)
            ) as resp,
        ):
            got = Streamed(resp.headers["x-llmmesh-region"], [])
            contents = 0
            async for event in events_of(resp.aiter_lines()):
                got.events.append(event)
                if event.data == "[DONE]":
                    break
                chunk = event.json()
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    contents += 1
                    if contents == K:
                        killed.append(got.region)
                    elif contents == 2 * K:
                        killed.append(await continuing_region(chunk["id"]))
                    else:
                        continue
                    await mesh.kill(killed[-1])
        assert killed[0] == got.region and len(set(killed)) == 2
        assert set(killed) < {"us-east", "us-west", "us-central"}
        got.assert_one_whole_stream()
        assert got.text == text
        assert (got.usage["prompt_tokens"], got.usage["completion_tokens"]) == (prompt_tokens, output_tokens)
        await assert_billed_once(mesh, "us", tenant_id, prompt_tokens, output_tokens)
        stream_id = got.chunks[0]["id"]
        assert set(await rows_of(mesh, "us", tenant_id)) <= {stream_id, f"{stream_id}-r2", f"{stream_id}-r3"}


async def rows_of(mesh: MultiRegionMesh, zone: str, tenant_id: str) -> dict[str, int]:
    """The tenant's usage rows in the zone store: request id -> tokens."""
    store = mesh.store(zone)
    query = sa.select(schema.usage_outbox.c.request_id, schema.usage_outbox.c.tokens).where(
        schema.usage_outbox.c.tenant_id == tenant_id
    )
    rows = await store.transaction(lambda conn: conn.execute(query).all())
    return {row.request_id: row.tokens for row in rows}


async def test_the_openai_sdk_streams_through_a_failover(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        tenant_id, secret = await mesh.new_key("us")
        async with openai.AsyncOpenAI(base_url=f"{mesh.url}/v1", api_key=secret, max_retries=0) as client:
            parts: list[str] = []
            usage = None
            finishes = 0
            async with client.chat.completions.with_streaming_response.create(
                model="auto",
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            ) as response:
                serving = response.headers["x-llmmesh-region"]
                async for chunk in await response.parse():
                    if chunk.usage is not None:
                        usage = chunk.usage
                    if not chunk.choices:
                        continue
                    finishes += chunk.choices[0].finish_reason is not None
                    if chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                        if len(parts) == K:
                            await mesh.kill(serving)
        assert serving == "us-east"
        assert "".join(parts) == text and finishes == 1
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, output_tokens)
        await assert_billed_once(mesh, "us", tenant_id, prompt_tokens, output_tokens)


async def test_a_failover_never_leaves_the_zone(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        tenant_id, secret = await mesh.new_key("eu")
        us_pods = [pod for name in ("us-east", "us-west") for pod in mesh.regions[name].pods]
        before = [cast(SimBackend, pod.backend).scheduler.stats().prefix_cache_queries for pod in us_pods]

        async def kill_the_zone(serving: str) -> None:
            assert serving.startswith("eu-")
            for region in ("eu-west", "eu-central"):
                await mesh.kill(region)

        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            got = await stream(http, secret, after_content=kill_the_zone)
        assert "[DONE]" not in [e.data for e in got.events]
        error = got.events[-1].json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "region_unavailable")
        assert "could continue" in error["message"] and "zone eu" in error["message"]
        ids = [e.id for e in got.events]
        assert ids == list(range(len(ids)))
        # The us regions saw nothing of it: no engine work, nothing stored.
        after = [cast(SimBackend, pod.backend).scheduler.stats().prefix_cache_queries for pod in us_pods]
        assert after == before
        assert await rows_of(mesh, "us", tenant_id) == {}
        assert await rows_of(mesh, "eu", tenant_id) != {}


async def test_a_stalled_region_is_failed_over_by_the_watchdog(tmp_path: Path) -> None:
    # us-east's pod stops producing after a few tokens and keeps its streams open.
    specs = regions({"sim_stall_after_tokens": K + 2})
    async with mesh_of(tmp_path, specs, stall_timeout_ms=1500) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        tenant_id, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            got = await stream(http, secret)
            assert got.region == "us-east"
            got.assert_one_whole_stream()
            assert got.text == text
            assert got.usage["completion_tokens"] == output_tokens

            # A whole (non-streamed) completion fails over the same way.
            resp = await http.post("/v1/chat/completions", json=body(stream=False), headers=auth(secret))
        assert resp.status_code == 200, resp.text
        completion = resp.json()
        assert completion["choices"][0]["message"]["content"] == text
        assert completion["usage"]["completion_tokens"] == output_tokens
        assert resp.headers["x-llmmesh-region"] == "us-west"
        await assert_billed_once(mesh, "us", tenant_id, 2 * prompt_tokens, 2 * output_tokens)
        pod = cast(SimBackend, mesh.regions["us-east"].pods[0].backend)
        await wait_until(lambda: pod.scheduler.running == 0, what="the stalled generations aborted")


class BlackHoleHop:
    """A TCP hop in front of a region that can stop forwarding without
    closing anything: a network cut, as far as both ends can tell."""

    def __init__(self, target: str) -> None:
        self._host, port = target.rsplit(":", 1)
        self._port = int(port)
        self.cut = asyncio.Event()
        # Only the region's replies are swallowed: what is sent to it still arrives.
        self.replies_cut = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        self._writers += [writer, up_writer]
        for source, sink, cut in ((reader, up_writer, self.cut), (up_reader, writer, self.replies_cut)):
            task = asyncio.create_task(self._pipe(source, sink, cut))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cut: asyncio.Event
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                if self.cut.is_set() or cut.is_set():
                    continue  # swallowed: nothing gets through, nothing is closed
                sink.write(data)
                await sink.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()


async def behind_a_hop(mesh: MultiRegionMesh, region: str) -> BlackHoleHop:
    """A started hop in front of ``region``, which reports the hop's address to geo-routing."""
    plane = mesh.plane(region)
    hop = BlackHoleHop(plane.address)
    await hop.start()
    plane.address = hop.address
    await plane.heartbeat.beat()
    return hop


async def test_a_cut_link_is_noticed_by_keepalive_and_failed_over(tmp_path: Path) -> None:
    # The stall watchdog is out of the way: only keepalive can notice the cut.
    async with mesh_of(tmp_path, regions(), stall_timeout_ms=600_000) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        hop = await behind_a_hop(mesh, "us-east")
        tenant_id, secret = await mesh.new_key("us")

        async def cut(serving: str) -> None:
            assert serving == "us-east"
            hop.cut.set()

        try:
            async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
                got = await stream(http, secret, after_content=cut)
            got.assert_one_whole_stream()
            assert got.text == text
            assert got.usage["completion_tokens"] == output_tokens
            # Cut off, us-east may go on generating and record more than the
            # client got (before or after us-west records): billed once all the same.
            await assert_billed_once(mesh, "us", tenant_id, prompt_tokens, output_tokens)
        finally:
            await hop.close()


async def test_a_turn_its_region_began_unseen_goes_on_in_the_zone_peer(tmp_path: Path) -> None:
    # us-east takes the turn and streams it, but none of it reaches the edge:
    # the edge cannot tell whether it began, and us-west goes on from nothing.
    async with mesh_of(tmp_path, regions(), stall_timeout_ms=600_000) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, prompt_tokens, output_tokens = await baseline(mesh, "us-west", reference_key)
        hop = await behind_a_hop(mesh, "us-east")
        tenant_id, secret = await mesh.new_key("us")
        try:
            async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
                # A turn opens the edge's session to us-east; then its replies stop.
                warm = await stream(http, secret)
                assert warm.region == "us-east"
                hop.replies_cut.set()
                got = await stream(http, secret)
            assert got.region == "us-west"
            got.assert_one_whole_stream()
            assert got.text == text
            assert got.usage["prompt_tokens"] == prompt_tokens
            assert got.usage["completion_tokens"] == output_tokens
            stream_id = got.chunks[0]["id"]
            query = sa.select(schema.turn_starts.c.home_region).where(
                schema.turn_starts.c.tenant_id == tenant_id, schema.turn_starts.c.request_id == stream_id
            )
            began = await mesh.store("us").transaction(lambda conn: conn.execute(query).scalar_one())
            assert began == "us-east", "the turn never reached us-east: nothing was tested"
            await assert_billed_once(mesh, "us", tenant_id, 2 * prompt_tokens, 2 * output_tokens)
        finally:
            await hop.close()


async def test_a_resume_after_a_failover_gets_the_right_events(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, reference_key = await mesh.new_key("us")
        text, _, output_tokens = await baseline(mesh, "us-west", reference_key)
        _, secret = await mesh.new_key("us")
        resumable = {"x-llmmesh-resumable": "true"}
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            # The client reads the role and K content events, the region dies, the client drops.
            first = await stream(http, secret, headers=resumable, stop_after=K + 1)
            await mesh.kill(first.region)
            stream_id = first.chunks[0]["id"]
            last = first.events[-1].id
            assert last == K
            resumed = await http.get(
                f"/v1/streams/{stream_id}", headers=auth(secret, **{"last-event-id": str(last)})
            )
            assert resumed.status_code == 200, resumed.text
            rest = [e async for e in events_of(_lines(resumed.text))]
            # Once the stream has ended, a resume names the region that finished it.
            again = await http.get(f"/v1/streams/{stream_id}", headers=auth(secret, **{"last-event-id": "0"}))
        assert again.headers["x-llmmesh-region"] == "us-west"
        whole = Streamed(first.region, first.events + rest)
        whole.assert_one_whole_stream()
        assert whole.text == text
        assert whole.usage["completion_tokens"] == output_tokens


async def _lines(text: str) -> AsyncIterator[str]:
    for line in text.split("\n"):
        yield line


# ---------------------------------------------------------------- session rehydration


async def test_a_conversation_goes_on_in_the_zone_peer_while_its_home_is_down(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        _, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60, headers=auth(secret)) as http:
            created = (await http.post("/v1/conversations", json={"title": "Rivers"})).json()
            cid = created["id"]
            assert created["home_region"] == "us-east"

            async def say(text: str) -> httpx.Response:
                resp = await http.post(
                    f"/v1/conversations/{cid}/messages", json={"content": text, "max_tokens": 8}
                )
                assert resp.status_code == 200, resp.text
                return resp

            first = await say("Tell me about rivers.")
            assert first.headers["x-llmmesh-region"] == "us-east"
            first_usage = first.json()["usage"]

            # Home down: the peer serves the follow-up from the zone store's history.
            await mesh.kill("us-east")
            second = await say("And lakes?")
            assert second.headers["x-llmmesh-region"] == "us-west"
            history = first_usage["prompt_tokens"] + first_usage["completion_tokens"]
            assert second.json()["usage"]["prompt_tokens"] > history
            got = await http.get(f"/v1/conversations/{cid}")
            assert got.status_code == 200 and got.json()["home_region"] == "us-east"
            listed = await http.get("/v1/conversations")
            assert [c["id"] for c in listed.json()["data"]] == [cid]
            messages = (await http.get(f"/v1/conversations/{cid}/messages")).json()["data"]
            assert [m["role"] for m in messages] == ["user", "assistant"] * 2

            # Home back: routing returns to it, and it sees every turn.
            await mesh.restart("us-east")
            third = await say("And seas?")
            assert third.headers["x-llmmesh-region"] == "us-east"
            assert third.json()["usage"]["prompt_tokens"] > second.json()["usage"]["prompt_tokens"]
            messages = (await http.get(f"/v1/conversations/{cid}/messages")).json()["data"]
        assert [m["content"] for m in messages if m["role"] == "user"] == [
            "Tell me about rivers.",
            "And lakes?",
            "And seas?",
        ]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert replies == [r.json()["choices"][0]["message"]["content"] for r in (first, second, third)]


async def test_a_conversation_turn_cut_mid_stream_is_stored_once_whole(tmp_path: Path) -> None:
    async with mesh_of(tmp_path, regions()) as mesh:
        tenant_id, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(
            base_url=mesh.url, timeout=60, headers=auth(secret, **EVENT_IDS)
        ) as http:
            cid = (await http.post("/v1/conversations", json={})).json()["id"]
            request = {"content": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}
            got = Streamed("", [])
            async with http.stream("POST", f"/v1/conversations/{cid}/messages", json=request) as resp:
                assert resp.status_code == 200
                contents = 0
                async for event in events_of(resp.aiter_lines()):
                    got.events.append(event)
                    if event.data == "[DONE]":
                        break
                    if event.json()["choices"] and event.json()["choices"][0]["delta"].get("content"):
                        contents += 1
                        if contents == K:
                            await mesh.kill(resp.headers["x-llmmesh-region"])
            got.assert_one_whole_stream()
            messages = (await http.get(f"/v1/conversations/{cid}/messages")).json()["data"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[0]["content"] == PROMPT
        assert messages[1]["content"] == got.text
        assert messages[1]["request_id"] == got.chunks[0]["id"]
        await settle_billing(mesh, "us")
        usage = messages[1]["usage"]
        assert (
            await store_tokens(mesh, "us", tenant_id) == usage["prompt_tokens"] + usage["completion_tokens"]
        )
