"""Delivery-aware billing, on an in-process two-region zone: a turn the mesh
fails mid-stream (its region killed, and no region could continue it in
time) is billed exactly the output its client received, settled by the
edge through a live region of the zone; a client that leaves is billed what
was generated; and ``ChatService.SettleTurn`` straight at a region refuses
what it cannot settle and never rewrites usage billing already took."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc
from tests.edge.sse import Event
from tests.edge.test_failover import (
    EVENT_IDS,
    K,
    auth,
    body,
    mesh_of,
    regions,
    rows_of,
    settle_billing,
    settlements,
    stream,
)

pytestmark = pytest.mark.asyncio


def content_tokens(events: list[Event]) -> int:
    """Output tokens the client received: the simulator's deltas carry one token each."""
    count = 0
    for event in events:
        choices = event.json().get("choices")
        if choices and choices[0]["delta"].get("content"):
            count += 1
    return count


async def test_a_turn_the_mesh_failed_bills_what_was_delivered_and_a_disconnect_what_was_generated(
    tmp_path: Path,
) -> None:
    # A failover deadline too short for any continuation: the killed region's turn ends failed.
    async with mesh_of(tmp_path, regions(), failover_deadline_ms=1) as mesh:
        tenant_id, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            # The counters are the process's: other tests in it may have settled turns.
            before = (await http.get("/metrics")).text
            settled_before, failed_before = settlements(before, "settled"), settlements(before, "failed")
            got = await stream(http, secret, after_content=mesh.kill)
            assert got.region == "us-east"
            error = got.events[-1].json()["error"]
            assert error["code"] == "region_unavailable" and "could continue" in error["message"]
            delivered = content_tokens(got.events)
            assert delivered >= K
            async with asyncio.timeout(30):
                while settlements(metrics := (await http.get("/metrics")).text, "settled") <= settled_before:
                    await asyncio.sleep(0.1)
            assert settlements(metrics, "failed") == failed_before
            await settle_billing(mesh, "us")
            billed = await mesh.global_plane.ledger.usage(tenant_id, "")
            # us-east died recording nothing: the turn is billed its prompt once and what arrived.
            assert billed.output_tokens == delivered and billed.input_tokens > 0
            stream_id = got.events[0].json()["id"]
            assert list(await rows_of(mesh, "us", tenant_id)) == [stream_id]

            # A client that leaves mid-stream is billed what was generated: no settlement.
            left_tenant, left_secret = await mesh.new_key("us")
            async with http.stream(
                "POST", "/v1/chat/completions", json=body(), headers=auth(left_secret, **EVENT_IDS)
            ) as resp:
                assert resp.status_code == 200 and resp.headers["x-llmmesh-region"] == "us-west"
                read = 0
                async for line in resp.aiter_lines():
                    read += line.startswith("data: ")
                    if read == K + 1:  # the role chunk and K tokens
                        break
            async with asyncio.timeout(30):
                while not await rows_of(mesh, "us", left_tenant):
                    await asyncio.sleep(0.1)
            await settle_billing(mesh, "us")
            rows = await rows_of(mesh, "us", left_tenant)
            left = await mesh.global_plane.ledger.usage(left_tenant, "")
            assert len(rows) == 1 and left.output_tokens >= K
            assert left.input_tokens + left.output_tokens == next(iter(rows.values()))
            assert settlements((await http.get("/metrics")).text, "settled") == settled_before + 1

        # Straight at a region: what it cannot settle is refused, naming the field...
        async with open_channel(mesh.plane("us-west").address) as channel:
            chat = chat_service_pb2_grpc.ChatServiceStub(channel)
            metadata = (("authorization", f"Bearer {left_secret}"),)
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await chat.SettleTurn(
                    chat_service_pb2.SettleTurnRequest(request_id="chatcmpl-none", delivered_output_tokens=1),
                    metadata=metadata,
                )
            assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
            assert "chatcmpl-none" in (unknown.value.details() or "")
            # ...another tenant's turn is not the caller's to settle...
            with pytest.raises(grpc.aio.AioRpcError) as foreign:
                await chat.SettleTurn(
                    chat_service_pb2.SettleTurnRequest(request_id=stream_id), metadata=metadata
                )
            assert foreign.value.code() is grpc.StatusCode.NOT_FOUND
            # ...and a turn billing already took stays billed: the answer says by how much.
            answer = await chat.SettleTurn(
                chat_service_pb2.SettleTurnRequest(request_id=next(iter(rows)), delivered_output_tokens=1),
                metadata=metadata,
            )
        assert answer.billed_output_tokens == left.output_tokens
        assert answer.over_billed_output_tokens == left.output_tokens - 1
        await settle_billing(mesh, "us")
        assert (await mesh.global_plane.ledger.usage(left_tenant, "")).output_tokens == left.output_tokens
