"""ChatService.ChatSession on a real in-process region, engine pod and
global plane: many turns on one stream, each with its own key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeAlias

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2 as pb
from llmmesh.v1 import chat_service_pb2_grpc, common_pb2, engine_service_pb2, engine_service_pb2_grpc
from tests.region.test_chat_servicer import billed
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio

USER = common_pb2.CHAT_ROLE_USER
Call: TypeAlias = grpc.aio.StreamStreamCall


def start(request_id: str, max_tokens: int = 8, key: str = DEV_KEY) -> pb.ChatSessionRequest:
    return pb.ChatSessionRequest(
        start=pb.SessionTurnStart(
            start=pb.ChatStart(
                request_id=request_id,
                model="auto",
                messages=[common_pb2.ChatMessage(role=USER, content=f"Tell me about {request_id}.")],
                sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
            ),
            api_key=key,
        )
    )


def cancel(request_id: str) -> pb.ChatSessionRequest:
    return pb.ChatSessionRequest(cancel=pb.SessionTurnCancel(request_id=request_id, reason="test"))


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as running:
        yield running


@pytest_asyncio.fixture
async def session(stack: Stack) -> AsyncIterator[Call]:
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).ChatSession()
        yield call
        call.cancel()


async def read_until_ended(
    call: Call, request_ids: set[str], read: Sequence[pb.TurnEvent] = ()
) -> list[pb.TurnEvent]:
    """Every event until each of ``request_ids`` ended, after the events already ``read``."""
    events: list[pb.TurnEvent] = list(read)
    ended = {e.request_id for e in events if e.response.WhichOneof("event") in ("finished", "error")}
    left = set(request_ids) - ended
    async with asyncio.timeout(20):
        while left:
            message = await call.read()
            assert message is not grpc.aio.EOF, f"the stream ended before {left} did"
            events += message.events
            left -= {
                e.request_id
                for e in message.events
                if e.response.WhichOneof("event") in ("finished", "error")
            }
    return events


def of(events: list[pb.TurnEvent], request_id: str) -> list[pb.ChatResponse]:
    return [e.response for e in events if e.request_id == request_id]


async def test_turns_share_the_stream_with_chats_events(stack: Stack, session: Call) -> None:
    ids = {f"turn-{i}" for i in range(3)}
    for request_id in sorted(ids):
        await session.write(start(request_id, max_tokens=10))
    events = await read_until_ended(session, ids)
    for request_id in ids:
        turn = of(events, request_id)
        kinds = [r.WhichOneof("event") for r in turn]
        assert kinds == ["started"] + ["delta"] * kinds.count("delta") + ["usage", "finished"]
        assert turn[0].started.request_id == request_id
        streamed = sum(len(r.delta.token_ids) for r in turn if r.HasField("delta"))
        assert streamed == turn[-2].usage.usage.output_tokens == 10
        assert await billed(stack, request_id)
    await session.done_writing()
    assert await session.read() is grpc.aio.EOF
    assert await session.code() == grpc.StatusCode.OK


async def test_a_turn_refused_before_it_starts_is_an_error_event_of_that_turn(session: Call) -> None:
    await session.write(start("bad-key", key="sk-wrong"))
    await session.write(start("good"))
    events = await read_until_ended(session, {"bad-key", "good"})
    refused = of(events, "bad-key")
    assert [r.WhichOneof("event") for r in refused] == ["error"]
    assert (refused[0].error.code, refused[0].error.reason) == (
        grpc.StatusCode.UNAUTHENTICATED.value[0],
        "API_KEY_INVALID",
    )
    assert of(events, "good")[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH


async def test_starts_in_one_message_are_each_judged_as_its_own_start(stack: Stack, session: Call) -> None:
    batch = pb.ChatSessionRequest()
    batch.starts.starts.extend(
        message.start
        for message in (
            start("one", max_tokens=6),
            start("wrong-key", key="sk-wrong"),
            start("two", max_tokens=6),
            start("one"),
            start(""),
        )
    )
    await session.write(batch)
    events = await read_until_ended(session, {"one", "two", "wrong-key", ""})
    refusals = sorted((e.request_id, e.response.error.reason) for e in events if e.response.HasField("error"))
    assert refusals == [
        ("", "INVALID_REQUEST"),
        ("one", "DUPLICATE_REQUEST"),
        ("wrong-key", "API_KEY_INVALID"),
    ]
    for request_id in ("one", "two"):
        turn = [r for r in of(events, request_id) if not r.HasField("error")]
        assert turn[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
        assert sum(len(r.delta.token_ids) for r in turn if r.HasField("delta")) == 6
        assert await billed(stack, request_id)


async def test_a_start_without_id_or_with_a_running_id_is_refused(session: Call) -> None:
    await session.write(start("twice", max_tokens=2000))
    await session.write(start("twice"))
    await session.write(start(""))
    errors: list[pb.TurnEvent] = []
    async with asyncio.timeout(10):
        while len(errors) < 2:
            message = await session.read()
            errors += [e for e in message.events if e.response.HasField("error")]
    assert sorted((e.request_id, e.response.error.reason) for e in errors) == [
        ("", "INVALID_REQUEST"),
        ("twice", "DUPLICATE_REQUEST"),
    ]
    await session.write(cancel("twice"))
    events = await read_until_ended(session, {"twice"})
    assert of(events, "twice")[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED


async def test_a_cancel_stops_its_turn_only_and_it_is_billed(stack: Stack, session: Call) -> None:
    await session.write(start("goes", max_tokens=2000))
    await session.write(start("stays", max_tokens=12))
    async with asyncio.timeout(10):
        while not any(
            e.request_id == "goes" and e.response.HasField("delta") for e in (await session.read()).events
        ):
            pass
    await session.write(cancel("goes"))
    events = await read_until_ended(session, {"goes", "stays"})
    assert of(events, "goes")[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    assert of(events, "stays")[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    assert await billed(stack, "goes")
    # Nothing left to stop for a turn that ended; one the stream never ran is refused.
    for request_id in ("stays", "never-ran"):
        await session.write(cancel(request_id))
    await session.done_writing()
    after: list[pb.TurnEvent] = []
    async with asyncio.timeout(10):
        while (message := await session.read()) is not grpc.aio.EOF:
            after += message.events
    assert [(e.request_id, e.response.error.code, e.response.error.reason) for e in after] == [
        ("never-ran", grpc.StatusCode.NOT_FOUND.value[0], "REQUEST_NOT_FOUND")
    ]
    assert await session.code() == grpc.StatusCode.OK


async def test_ending_the_stream_cancels_its_turns_and_bills_them(stack: Stack) -> None:
    async with open_channel(stack.engine.address) as engine_channel:
        engine = engine_service_pb2_grpc.EngineServiceStub(engine_channel)
        async with open_channel(stack.region.address) as channel:
            call = chat_service_pb2_grpc.ChatServiceStub(channel).ChatSession()
            for request_id in ("a", "b"):
                await call.write(start(request_id, max_tokens=2000))
            seen: set[str] = set()
            async with asyncio.timeout(10):
                while seen != {"a", "b"}:
                    seen |= {e.request_id for e in (await call.read()).events if e.response.HasField("delta")}
            call.cancel()
        async with asyncio.timeout(10):
            while (await engine.GetLoad(engine_service_pb2.GetLoadRequest())).report.running:
                await asyncio.sleep(0.02)
    assert await billed(stack, "a") and await billed(stack, "b")


async def test_a_draining_region_refuses_new_turns_and_ends_the_stream_after_the_running_ones(
    stack: Stack, session: Call
) -> None:
    await session.write(start("running", max_tokens=30))
    read: list[pb.TurnEvent] = []
    async with asyncio.timeout(10):
        while not any(e.request_id == "running" for e in read):
            read += (await session.read()).events
    stack.region.sessions.drain()
    await session.write(start("late"))
    events = await read_until_ended(session, {"running", "late"}, read)
    late = of(events, "late")
    assert [r.WhichOneof("event") for r in late] == ["error"]
    assert (late[0].error.code, late[0].error.reason) == (
        grpc.StatusCode.UNAVAILABLE.value[0],
        "REGION_UNAVAILABLE",
    )
    assert of(events, "running")[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    async with asyncio.timeout(10):
        assert await session.read() is grpc.aio.EOF
    assert await session.code() == grpc.StatusCode.OK


async def test_a_message_holding_no_action_ends_the_stream_and_cancels_its_turns(
    stack: Stack, session: Call
) -> None:
    await session.write(start("running", max_tokens=2000))
    async with asyncio.timeout(10):
        while not any(
            e.request_id == "running" and e.response.HasField("delta") for e in (await session.read()).events
        ):
            pass
    await session.write(pb.ChatSessionRequest())
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await read_to_the_end(session)
    error = from_rpc_error(failed.value)
    assert (error.code, error.reason, error.metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        {"param": "action"},
    )
    assert await billed(stack, "running")


async def read_to_the_end(call: Call) -> None:
    """Read until the stream ends (a failed one raises)."""
    async with asyncio.timeout(10):
        while await call.read() is not grpc.aio.EOF:
            pass
