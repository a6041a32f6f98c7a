"""Fuzzing a region's ChatService straight at its port, as a caller with a
valid key would: whatever ``ChatStart`` it sends, on ``Chat`` or on a
``ChatSession`` stream, no turn streams a token that billing does not
hold. Request ids are reused within and across tenants, over-long and
odd; continuations name turns that exist, that belong to another tenant,
or none; models, roles and sampling are out of range."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmmesh.core.grpcserver import open_channel
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import chat_service_pb2 as pb
from llmmesh.v1 import chat_service_pb2_grpc, common_pb2
from tests.conftest import fresh_schema
from tests.stack import DEV_KEY, Stack, running_stack

OTHER_KEY = "sk-llmmesh-other-tenant"
_IDS = ["turn-a", "turn-b", "x" * 300, "", "ünï/çødé id", "turn a\n"]


_HELLO = common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Say something.")


@dataclass(frozen=True)
class Attempt:
    """One turn as the attacker sends it."""

    start: pb.ChatStart
    key: str
    on_session: bool


@st.composite
def _continuation(draw: st.DrawFn) -> pb.Continuation:
    return pb.Continuation(
        original_request_id=draw(st.sampled_from(_IDS)),
        original_region=draw(st.sampled_from(["us-east", "eu-west", ""])),
        emitted_token_ids=draw(st.lists(st.integers(0, 2**32 - 1), max_size=6)),
        emitted_text=draw(st.text(max_size=30)),
        last_sequence=draw(st.integers(-3, 50)),
    )


@st.composite
def _message(draw: st.DrawFn) -> common_pb2.ChatMessage:
    role = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 77]))
    return common_pb2.ChatMessage(role=role, content=draw(st.text(max_size=40)))  # type: ignore[arg-type]


@st.composite
def _attempt(draw: st.DrawFn) -> Attempt:
    sampling = common_pb2.SamplingParams()
    max_tokens = draw(st.one_of(st.none(), st.integers(-1, 12), st.just(2**31 - 1)))
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    start = pb.ChatStart(
        request_id=draw(st.one_of(st.sampled_from(_IDS), st.text(max_size=12))),
        model=draw(st.sampled_from(["auto", "auto", "llmmesh-tiny", "", "nope", "m" * 20_000])),
        messages=draw(st.one_of(st.just([_HELLO]), st.lists(_message(), max_size=3))),
        sampling=sampling,
        user=draw(st.sampled_from(["", "u1"])),
    )
    if draw(st.integers(0, 2)) == 0:
        start.continuation.CopyFrom(draw(_continuation()))
    return Attempt(start, draw(st.sampled_from([DEV_KEY, OTHER_KEY])), draw(st.booleans()))


@dataclass
class Streamed:
    """What one turn delivered to its caller."""

    key: str
    request_id: str
    tokens: int
    continues: bool


def _refused_clearly(err: grpc.aio.AioRpcError | None) -> None:
    """A refusal is a canonical code, never UNKNOWN (an unhandled error in a servicer)."""
    assert err is None or err.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), err


async def _on_chat(channel: grpc.aio.Channel, attempt: Attempt) -> AsyncIterator[pb.ChatResponse]:
    metadata = (("authorization", f"Bearer {attempt.key}"),)
    call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
        iter([pb.ChatRequest(start=attempt.start)]), metadata=metadata, timeout=20
    )
    async for response in call:
        yield response


async def _on_session(channel: grpc.aio.Channel, attempt: Attempt) -> AsyncIterator[pb.ChatResponse]:
    call = chat_service_pb2_grpc.ChatServiceStub(channel).ChatSession(timeout=20)
    await call.write(
        pb.ChatSessionRequest(start=pb.SessionTurnStart(start=attempt.start, api_key=attempt.key))
    )
    await call.done_writing()
    async for message in call:
        for event in message.events:
            yield event.response


async def _send(stack: Stack, attempt: Attempt) -> Streamed:
    """Run ``attempt`` on Chat or on a ChatSession stream; what it streamed."""
    request_id, tokens = "", 0
    failed: grpc.aio.AioRpcError | None = None
    send = _on_session if attempt.on_session else _on_chat
    async with open_channel(stack.region.address) as channel:
        try:
            async for response in send(channel, attempt):
                if response.HasField("started"):
                    request_id = response.started.request_id
                tokens += len(response.delta.token_ids) if response.HasField("delta") else 0
        except grpc.aio.AioRpcError as err:
            failed = err
    _refused_clearly(failed)
    return Streamed(attempt.key, request_id, tokens, attempt.start.HasField("continuation"))


async def _scenario(attempts: Sequence[Attempt], database_url: str, zone_store_url: str) -> None:
    async with running_stack(
        database_url=database_url,
        region_overrides={"zone_store_url": zone_store_url},
        sim_prefill_overhead_s=0.0001,
        sim_prefill_per_token_s=0.000001,
        sim_inter_token_s=0.0005,
    ) as stack:
        book = stack.global_plane.tenants
        other = await book.create_tenant("other", "us", TenantTier.PRO)
        await book.create_api_key(other.id, secret=OTHER_KEY)
        dev = await book.authenticate(DEV_KEY)
        tenant_of_key = {DEV_KEY: dev[0].id, OTHER_KEY: other.id}
        # Sequential and concurrent sends both: duplicates race in the second half.
        half = len(attempts) // 2
        results = [await _send(stack, a) for a in attempts[:half]]
        results += await asyncio.gather(*(_send(stack, a) for a in attempts[half:]))
        await stack.region.gateway.drain()
        assert await stack.region.shipper.flush(timeout_s=15), "usage not delivered"
        ledger = stack.global_plane.ledger
        for key, tenant_id in tenant_of_key.items():
            streamed = [r for r in results if r.key == key and r.tokens]
            billed = await ledger.usage(tenant_id)
            assert billed.output_tokens >= sum(r.tokens for r in streamed), (key, streamed, billed)
            # Every turn that streamed pays for its prompt (a continuation's was billed where it began).
            assert billed.input_tokens >= sum(1 for r in streamed if not r.continues), (key, streamed, billed)
        streamed_ids = [r.request_id for r in results if r.tokens]
        assert all(streamed_ids), "a turn streamed tokens before naming its request id"


@pytest.mark.slow
@pytest.mark.services
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempts=st.lists(_attempt(), min_size=1, max_size=8))
def test_no_turn_streams_a_token_that_billing_does_not_hold(
    attempts: list[Attempt], postgres_url: str
) -> None:
    """On PostgreSQL, whose column lengths are enforced, as in production."""
    with fresh_schema(postgres_url) as global_url, fresh_schema(postgres_url) as zone_url:
        asyncio.run(_scenario(attempts, global_url, zone_url))
