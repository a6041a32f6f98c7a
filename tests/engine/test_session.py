"""``EngineService.GenerateSession`` over a real ``grpc.aio`` server: many
generations on one stream, a step's events in one message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.test_servicer import running, wait_until_running

pytestmark = pytest.mark.asyncio

USER = common_pb2.CHAT_ROLE_USER
Call: TypeAlias = grpc.aio.StreamStreamCall


def start(request_id: str, max_tokens: int = 8, **fields: object) -> pb.GenerateSessionRequest:
    if "prompt_token_ids" not in fields and "messages" not in fields:
        fields["messages"] = [common_pb2.ChatMessage(role=USER, content=f"tell me about {request_id}")]
    return pb.GenerateSessionRequest(
        start=pb.GenerateStart(
            request_id=request_id,
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
            **fields,  # type: ignore[arg-type]
        )
    )


def cancel(request_id: str) -> pb.GenerateSessionRequest:
    return pb.GenerateSessionRequest(cancel=pb.GenerateCancel(request_id=request_id, reason="test"))


@pytest_asyncio.fixture
async def stub(pod: EnginePod) -> AsyncIterator[pb_grpc.EngineServiceAsyncStub]:
    async with open_channel(pod.address) as channel:
        yield pb_grpc.EngineServiceStub(channel)  # type: ignore[misc]


@pytest_asyncio.fixture
async def slow_stub(slow_pod: EnginePod) -> AsyncIterator[pb_grpc.EngineServiceAsyncStub]:
    async with open_channel(slow_pod.address) as channel:
        yield pb_grpc.EngineServiceStub(channel)  # type: ignore[misc]


async def read_until_ended(call: Call, request_ids: set[str]) -> list[pb.GenerateSessionResponse]:
    """Messages until every generation in ``request_ids`` has finished or failed."""
    messages: list[pb.GenerateSessionResponse] = []
    left = set(request_ids)
    async with asyncio.timeout(10):
        while left:
            message = await call.read()
            assert message is not grpc.aio.EOF, f"the stream ended before {left} did"
            messages.append(message)
            left -= {e.request_id for e in message.events if e.WhichOneof("event") in ("finished", "error")}
    return messages


def events_of(messages: list[pb.GenerateSessionResponse], request_id: str) -> list[pb.GenerationEvent]:
    return [e for m in messages for e in m.events if e.request_id == request_id]


async def test_generations_share_the_stream_and_a_step_is_one_message(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = stub.GenerateSession()
    ids = {f"gen-{i}" for i in range(4)}
    for request_id in sorted(ids):
        await call.write(start(request_id, max_tokens=12))
    messages = await read_until_ended(call, ids)
    for request_id in ids:
        events = events_of(messages, request_id)
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds == ["started"] + ["delta"] * 12 + ["finished"]
        assert [e.delta.sequence for e in events[1:-1]] == list(range(1, 13))
        assert events[-1].finished.usage.output_tokens == 12
    # Generations decoding in the same step reach the client together.
    assert any(len({e.request_id for e in m.events if e.HasField("delta")}) > 1 for m in messages)
    assert len(messages) < sum(len(m.events) for m in messages)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_starts_in_one_message_run_as_that_many_start_messages(
    slow_stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = slow_stub.GenerateSession()
    batch = pb.GenerateSessionRequest()
    batch.starts.starts.extend(start(request_id, max_tokens=3).start for request_id in ("b1", "b2", "b1", ""))
    await call.write(batch)
    messages = await read_until_ended(call, {"b1", "b2"})
    for request_id in ("b1", "b2"):
        # The second b1's refusal is an event under that id too.
        kinds = [e.WhichOneof("event") for e in events_of(messages, request_id) if not e.HasField("error")]
        assert kinds == ["started"] + ["delta"] * 3 + ["finished"]
    errors = sorted((e.request_id, e.error.reason) for m in messages for e in m.events if e.HasField("error"))
    assert errors == [("", "INVALID_REQUEST"), ("b1", "DUPLICATE_REQUEST")]
    call.cancel()


async def test_a_bad_start_fails_its_generation_only(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    call = stub.GenerateSession()
    await call.write(start("bad", model="no-such-model"))
    await call.write(start("good"))
    messages = await read_until_ended(call, {"bad", "good"})
    bad = events_of(messages, "bad")
    assert [e.WhichOneof("event") for e in bad] == ["error"]
    assert (bad[0].error.code, bad[0].error.reason) == (grpc.StatusCode.NOT_FOUND.value[0], "UNKNOWN_MODEL")
    assert events_of(messages, "good")[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    call.cancel()


async def test_an_unknown_role_fails_its_generation_with_a_reason(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = stub.GenerateSession()
    role = 77  # no ChatRole: the wire carries any number in an enum field
    await call.write(start("bad", messages=[common_pb2.ChatMessage(role=role, content="hi")]))  # type: ignore[arg-type]
    (event,) = events_of(await read_until_ended(call, {"bad"}), "bad")
    assert (event.error.code, event.error.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "INVALID_REQUEST",
    )
    assert event.error.metadata["param"] == "messages"
    call.cancel()


async def test_a_start_without_id_or_with_a_running_id_is_refused(
    slow_stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = slow_stub.GenerateSession()
    await call.write(start("twice", max_tokens=50))
    await call.write(start("twice", max_tokens=50))
    await call.write(start(""))
    errors: list[pb.GenerationEvent] = []
    async with asyncio.timeout(10):
        while len(errors) < 2:
            message = await call.read()
            errors += [e for e in message.events if e.HasField("error")]
    assert sorted((e.request_id, e.error.reason) for e in errors) == [
        ("", "INVALID_REQUEST"),
        ("twice", "DUPLICATE_REQUEST"),
    ]
    assert await running(slow_stub) == 1, "the refusal stopped the running generation"
    call.cancel()


async def test_a_cancel_stops_one_generation_and_keeps_its_usage(
    slow_stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = slow_stub.GenerateSession()
    await call.write(start("stays", max_tokens=6))
    await call.write(start("goes", max_tokens=200))
    await wait_until_running(slow_stub, 2)
    await call.write(cancel("goes"))
    messages = await read_until_ended(call, {"stays", "goes"})
    goes, stays = events_of(messages, "goes"), events_of(messages, "stays")
    assert goes[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    assert goes[-1].finished.usage.output_tokens == sum(len(e.delta.token_ids) for e in goes)
    assert goes[-1].finished.usage.output_tokens < 200
    assert stays[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    call.cancel()


async def test_a_cancel_of_an_ended_generation_is_moot_and_of_an_unknown_one_refused(
    stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = stub.GenerateSession()
    await call.write(start("done", max_tokens=2))
    await read_until_ended(call, {"done"})
    for request_id in ("done", "never-ran", ""):
        await call.write(cancel(request_id))
    await call.write(start("after", max_tokens=3))
    await call.done_writing()
    events: list[pb.GenerationEvent] = []
    async with asyncio.timeout(10):
        while (message := await call.read()) is not grpc.aio.EOF:
            events += message.events
    refusals = [(e.request_id, e.error.code, e.error.reason) for e in events if e.HasField("error")]
    assert sorted(refusals) == [
        ("", grpc.StatusCode.INVALID_ARGUMENT.value[0], "INVALID_REQUEST"),
        ("never-ran", grpc.StatusCode.NOT_FOUND.value[0], "REQUEST_NOT_FOUND"),
    ]
    assert not [e for e in events if e.request_id == "done"], "an ended generation's cancel got an answer"
    assert [e.finished.usage.output_tokens for e in events if e.HasField("finished")] == [3]
    assert await call.code() == grpc.StatusCode.OK


async def test_ending_the_stream_aborts_what_runs_on_it(
    slow_pod: EnginePod, slow_stub: pb_grpc.EngineServiceAsyncStub
) -> None:
    call = slow_stub.GenerateSession()
    for request_id in ("a", "b"):
        await call.write(start(request_id, max_tokens=200))
    await wait_until_running(slow_stub, 2)
    call.cancel()
    await wait_until_running(slow_stub, 0)
    assert isinstance(slow_pod.backend, SimBackend)
    assert slow_pod.backend.scheduler.steps < 100, "the generations ran to their end instead of aborting"


async def test_a_half_closed_stream_ends_after_its_generations(
    slow_stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = slow_stub.GenerateSession()
    await call.write(start("last", max_tokens=5))
    await call.done_writing()
    messages = []
    async with asyncio.timeout(10):
        while (message := await call.read()) is not grpc.aio.EOF:
            messages.append(message)
    assert events_of(messages, "last")[-1].finished.usage.output_tokens == 5
    assert await call.code() == grpc.StatusCode.OK


@pytest.mark.parametrize(
    "message",
    [pb.GenerateSessionRequest(), pb.GenerateSessionRequest(starts=pb.GenerateStarts())],
    ids=["no-action", "no-start-in-starts"],
)
async def test_a_message_holding_no_action_ends_the_stream_with_invalid_argument(
    slow_stub: pb_grpc.EngineServiceAsyncStub, message: pb.GenerateSessionRequest
) -> None:
    call = slow_stub.GenerateSession()
    await call.write(start("running", max_tokens=200))
    await wait_until_running(slow_stub, 1)
    await call.write(message)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await read_to_the_end(call)
    error = from_rpc_error(failed.value)
    assert (error.code, error.reason, error.metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        {"param": "action"},
    )
    await wait_until_running(slow_stub, 0)


async def read_to_the_end(call: Call) -> None:
    """Read until the stream ends (a failed one raises)."""
    async with asyncio.timeout(10):
        while await call.read() is not grpc.aio.EOF:
            pass
