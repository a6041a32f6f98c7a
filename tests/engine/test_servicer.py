"""EngineService over a real ``grpc.aio`` server on port 0, in-process."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.servicer import SERVICE_NAME
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.support import FAST

USER = common_pb2.CHAT_ROLE_USER


def start(request_id: str = "req-1", **fields: object) -> pb.GenerateRequest:
    if "prompt_token_ids" not in fields and "messages" not in fields:
        fields["messages"] = [common_pb2.ChatMessage(role=USER, content="tell me about the sea")]
    return pb.GenerateRequest(start=pb.GenerateStart(request_id=request_id, **fields))  # type: ignore[arg-type]


async def one(message: pb.GenerateRequest) -> AsyncIterator[pb.GenerateRequest]:
    yield message


async def stub_for(pod: EnginePod) -> AsyncIterator[pb_grpc.EngineServiceAsyncStub]:
    async with open_channel(pod.address) as channel:
        yield pb_grpc.EngineServiceStub(channel)  # type: ignore[misc]


@pytest_asyncio.fixture
async def stub(pod: EnginePod) -> AsyncIterator[pb_grpc.EngineServiceAsyncStub]:
    async for engine_stub in stub_for(pod):
        yield engine_stub


@pytest_asyncio.fixture
async def slow_stub(slow_pod: EnginePod) -> AsyncIterator[pb_grpc.EngineServiceAsyncStub]:
    async for engine_stub in stub_for(slow_pod):
        yield engine_stub


async def running(stub: pb_grpc.EngineServiceAsyncStub) -> int:
    return int((await stub.GetLoad(pb.GetLoadRequest())).report.running)


async def wait_until_running(stub: pb_grpc.EngineServiceAsyncStub, count: int) -> None:
    for _ in range(500):
        if await running(stub) == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"running never became {count}")


@pytest.mark.asyncio
async def test_generate_streams_started_deltas_and_finished(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    responses = [
        r async for r in stub.Generate(one(start(sampling=common_pb2.SamplingParams(max_tokens=10))))
    ]
    kinds = [r.WhichOneof("event") for r in responses]
    assert kinds == ["started"] + ["delta"] * 10 + ["finished"]
    started, deltas, finished = (
        responses[0].started,
        [r.delta for r in responses[1:-1]],
        responses[-1].finished,
    )
    assert started.pod_id == "pod-0" and started.prompt_tokens > 0
    assert [d.sequence for d in deltas] == list(range(1, 11))
    assert [d.output_token_offset for d in deltas] == list(range(10))
    assert finished.reason == common_pb2.FINISH_REASON_LENGTH
    assert finished.usage.input_tokens == started.prompt_tokens and finished.usage.output_tokens == 10
    tokenized = await stub.Tokenize(
        pb.TokenizeRequest(
            messages=[common_pb2.ChatMessage(role=USER, content="tell me about the sea")],
            add_generation_prompt=True,
        )
    )
    assert len(tokenized.token_ids) == started.prompt_tokens


@pytest.mark.asyncio
async def test_resumed_stream_offsets_count_resumed_tokens(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    whole = [r async for r in stub.Generate(one(start("whole")))]
    tokens = [t for r in whole if r.HasField("delta") for t in r.delta.token_ids]
    rest = [r async for r in stub.Generate(one(start("rest", resume_output_token_ids=tokens[:4])))]
    deltas = [r.delta for r in rest if r.HasField("delta")]
    assert deltas[0].sequence == 1 and deltas[0].output_token_offset == 4
    assert [t for d in deltas for t in d.token_ids] == tokens[4:]


@pytest.mark.asyncio
async def test_a_cancel_message_ends_with_cancelled_and_usage(
    slow_stub: pb_grpc.EngineServiceAsyncStub,
) -> None:
    call = slow_stub.Generate()
    await call.write(start("to-cancel"))
    assert (await call.read()).WhichOneof("event") == "started"
    assert (await call.read()).WhichOneof("event") == "delta"
    await call.write(pb.GenerateRequest(cancel=pb.GenerateCancel(request_id="to-cancel", reason="user left")))
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    finished = rest[-1].finished
    assert finished.reason == common_pb2.FINISH_REASON_CANCELLED
    # The usage so far: the delta read above and any that raced the cancel.
    assert finished.usage.output_tokens == 1 + len(rest[:-1])
    assert await call.code() == grpc.StatusCode.OK
    assert await running(slow_stub) == 0


async def read_to_end(call: grpc.aio.StreamStreamCall, into: list[pb.GenerateResponse]) -> None:
    while (message := await call.read()) is not grpc.aio.EOF:
        into.append(message)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("second", "param"),
    [(start("second"), "start"), (pb.GenerateRequest(), "action")],
    ids=["start", "empty"],
)
async def test_a_second_start_or_an_empty_message_stops_the_generation_and_is_refused(
    slow_stub: pb_grpc.EngineServiceAsyncStub, second: pb.GenerateRequest, param: str
) -> None:
    call = slow_stub.Generate()
    await call.write(start("first"))
    assert (await call.read()).WhichOneof("event") == "started"
    await call.write(second)
    rest: list[pb.GenerateResponse] = []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await read_to_end(call, rest)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_REQUEST", param)
    # The first generation stopped there, its usage reported.
    assert rest[-1].finished.reason == common_pb2.FINISH_REASON_CANCELLED
    assert await running(slow_stub) == 0


@pytest.mark.asyncio
async def test_tokenize_refuses_an_unknown_role(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    request = pb.TokenizeRequest(messages=[common_pb2.ChatMessage(role=77, content="hi")])  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Tokenize(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == ("INVALID_REQUEST", "messages")


@pytest.mark.asyncio
async def test_cancelling_the_call_aborts_the_generation(
    slow_pod: EnginePod, slow_stub: pb_grpc.EngineServiceAsyncStub
) -> None:
    call = slow_stub.Generate(one(start("gone")))
    assert (await call.read()).WhichOneof("event") == "started"
    assert await running(slow_stub) == 1
    call.cancel()
    await wait_until_running(slow_stub, 0)
    assert isinstance(slow_pod.backend, SimBackend)
    assert slow_pod.backend.scheduler.steps < 12, "the generation ran to its end instead of aborting"


def bad(**fields: object) -> pb.GenerateRequest:
    return start("bad", **fields)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("message", "code", "reason", "param"),
    [
        (pb.GenerateRequest(cancel=pb.GenerateCancel()), "INVALID_ARGUMENT", "INVALID_REQUEST", "start"),
        (bad(prompt_token_ids=[]), "INVALID_ARGUMENT", "EMPTY_PROMPT", "prompt"),
        (bad(messages=[common_pb2.ChatMessage(role=USER)]), "INVALID_ARGUMENT", "EMPTY_PROMPT", "messages"),
        (bad(prompt_token_ids=[7] * FAST.context_window), "INVALID_ARGUMENT", "PROMPT_TOO_LONG", "prompt"),
        (
            bad(sampling=common_pb2.SamplingParams(max_tokens=0)),
            "INVALID_ARGUMENT",
            "INVALID_SAMPLING",
            "max_tokens",
        ),
        (
            bad(sampling=common_pb2.SamplingParams(temperature=-0.5)),
            "INVALID_ARGUMENT",
            "INVALID_SAMPLING",
            "temperature",
        ),
        (bad(sampling=common_pb2.SamplingParams(top_p=0.0)), "INVALID_ARGUMENT", "INVALID_SAMPLING", "top_p"),
        (bad(sampling=common_pb2.SamplingParams(top_p=1.5)), "INVALID_ARGUMENT", "INVALID_SAMPLING", "top_p"),
        (bad(prompt_token_ids=[10**6]), "INVALID_ARGUMENT", "INVALID_REQUEST", "prompt_token_ids"),
        (
            bad(messages=[common_pb2.ChatMessage(content="no role")]),
            "INVALID_ARGUMENT",
            "INVALID_REQUEST",
            "messages",
        ),
        (
            bad(messages=[common_pb2.ChatMessage(role=77, content="a role the contract lacks")]),  # type: ignore[arg-type]
            "INVALID_ARGUMENT",
            "INVALID_REQUEST",
            "messages",
        ),
        (start(""), "INVALID_ARGUMENT", "INVALID_REQUEST", "request_id"),
        (bad(model="gpt-9"), "NOT_FOUND", "UNKNOWN_MODEL", "model"),
    ],
)
async def test_bad_requests_fail_with_a_reason_and_param(
    stub: pb_grpc.EngineServiceAsyncStub, message: pb.GenerateRequest, code: str, reason: str, param: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        _ = [r async for r in stub.Generate(one(message))]
    assert raised.value.code() == getattr(grpc.StatusCode, code)
    error = from_rpc_error(raised.value)
    assert (error.reason, error.metadata.get("param")) == (reason, param)


@pytest.mark.asyncio
async def test_a_duplicate_running_request_id_is_refused(slow_stub: pb_grpc.EngineServiceAsyncStub) -> None:
    first = slow_stub.Generate(one(start("twice")))
    assert (await first.read()).WhichOneof("event") == "started"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        _ = [r async for r in slow_stub.Generate(one(start("twice")))]
    assert raised.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert from_rpc_error(raised.value).reason == "DUPLICATE_REQUEST"
    first.cancel()


@pytest.mark.asyncio
async def test_kv_events_replay_after_reconnect_without_a_gap(stub: pb_grpc.EngineServiceAsyncStub) -> None:
    _ = [r async for r in stub.Generate(one(start("one")))]
    feed = stub.StreamKvEvents(pb.StreamKvEventsRequest())
    first = await feed.read()
    feed.cancel()
    info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert first.instance_id == info.instance_id and first.pod_id == "pod-0" and not first.gap
    sequences = [e.sequence for e in first.events]
    assert sequences == list(range(1, len(sequences) + 1)) and first.events[0].HasField("block_stored")
    _ = [r async for r in stub.Generate(one(start("two", prompt_token_ids=list(range(400, 430)))))]
    again = stub.StreamKvEvents(pb.StreamKvEventsRequest(after_sequence=sequences[-1]))
    replay = await again.read()
    again.cancel()
    assert not replay.gap
    assert replay.events[0].sequence == sequences[-1] + 1


@pytest.mark.asyncio
async def test_kv_events_flag_a_gap_when_events_were_dropped() -> None:
    pod = await start_engine(dataclasses.replace(FAST, kv_event_retention=2))
    try:
        async with open_channel(pod.address) as channel:
            stub: pb_grpc.EngineServiceAsyncStub = pb_grpc.EngineServiceStub(channel)  # type: ignore[assignment]
            _ = [r async for r in stub.Generate(one(start("many", prompt_token_ids=list(range(400, 440)))))]
            feed = stub.StreamKvEvents(pb.StreamKvEventsRequest(after_sequence=0))
            batch = await feed.read()
            feed.cancel()
            assert batch.gap and len(batch.events) == 2
    finally:
        await pod.stop(0.5)


@pytest.mark.asyncio
async def test_health_info_and_load(pod: EnginePod, stub: pb_grpc.EngineServiceAsyncStub) -> None:
    async with open_channel(pod.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert (info.backend, info.model, info.block_size, info.kv_blocks_total) == (
        "sim",
        "llmmesh-tiny",
        4,
        256,
    )
    report = (await stub.GetLoad(pb.GetLoadRequest())).report
    assert report.health == common_pb2.HEALTH_STATE_SERVING and report.pod_id == "pod-0"
    assert report.report_time.seconds > 0
    if not report.gpu.available:
        assert report.gpu.unavailable_reason and not report.gpu.devices


@pytest.mark.asyncio
async def test_watch_load_reports_until_the_pod_drains(
    pod: EnginePod, stub: pb_grpc.EngineServiceAsyncStub
) -> None:
    watch = stub.WatchLoad(pb.WatchLoadRequest(interval_ms=5))
    reports = [await watch.read(), await watch.read()]
    assert all(r.report.health == common_pb2.HEALTH_STATE_SERVING for r in reports)
    # The drain ends the feed cleanly; it does not hold the drain up.
    await pod.stop(grace_s=5.0)
    while await watch.read() is not grpc.aio.EOF:
        pass
    assert await watch.code() == grpc.StatusCode.OK
