"""Injected faults of the simulator (:mod:`engine.sim.faults`): mid-stream
failures, stalls and crashes, through the backend, the gRPC servicer and the
real pod process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmmesh.core.errors import Reason, Unavailable, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.backend import GenerationRequest, SamplingOptions
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.faults import CRASH_EXIT_CODE, RETRY_AFTER_S, FaultPlan
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.support import FAST, collect

# Below the shortest natural reply, so every generation plans exactly this many.
MAX_TOKENS = 10
BOUND_S = 30.0


def prompt(index: int) -> list[int]:
    return list(range(300 + index, 330 + index))


def start(request_id: str, prompt_token_ids: list[int], **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        start=pb.GenerateStart(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS),
            **fields,  # type: ignore[arg-type]
        )
    )


async def one(message: pb.GenerateRequest) -> AsyncIterator[pb.GenerateRequest]:
    yield message


@pytest_asyncio.fixture
async def failing_pod() -> AsyncIterator[EnginePod]:
    engine_pod = await start_engine(dataclasses.replace(FAST, sim_error_rate=1.0, pod_id="failing"))
    yield engine_pod
    await engine_pod.stop(grace_s=0.5)


def stub_on(channel: grpc.aio.Channel) -> pb_grpc.EngineServiceAsyncStub:
    return pb_grpc.EngineServiceStub(channel)  # type: ignore[return-value]


def retry_delay_s(err: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo the server sent, read directly (``from_rpc_error`` would
    fill in a default for UNAVAILABLE)."""
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            return float(retry.retry_delay.ToMilliseconds() / 1000)
    return None


async def until_error(
    call: AsyncIterator[pb.GenerateResponse],
) -> tuple[list[pb.GenerateResponse], grpc.aio.AioRpcError]:
    """What a stream sent before it failed, and its error."""
    received: list[pb.GenerateResponse] = []
    try:
        async for response in call:
            received.append(response)
    except grpc.aio.AioRpcError as err:
        return received, err
    raise AssertionError(f"the stream ended without an error after {len(received)} messages")


def tokens_of(responses: list[pb.GenerateResponse]) -> list[int]:
    return [token for r in responses if r.HasField("delta") for token in r.delta.token_ids]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sim_error_rate", 1.5, "sim_error_rate must be between 0 and 1"),
        ("sim_error_rate", -0.1, "sim_error_rate must be between 0 and 1"),
        ("sim_error_rate", math.nan, "sim_error_rate must be between 0 and 1"),
        ("sim_stall_after_tokens", -1, "sim_stall_after_tokens must not be negative"),
        ("sim_crash_after_generations", -1, "sim_crash_after_generations must not be negative"),
    ],
)
def test_fault_settings_are_validated(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSettings(**{field: value})  # type: ignore[arg-type]


def test_an_in_process_crash_fault_needs_a_callback() -> None:
    with pytest.raises(ValueError, match="needs an on_crash callback"):
        SimBackend(dataclasses.replace(FAST, sim_crash_after_generations=1))


@pytest.mark.asyncio
async def test_error_rate_one_fails_every_generation_after_the_predicted_tokens(
    failing_pod: EnginePod, pod: EnginePod
) -> None:
    plan = FaultPlan(error_rate=1.0)
    async with open_channel(failing_pod.address) as failing_channel, open_channel(pod.address) as channel:
        failing, healthy = stub_on(failing_channel), stub_on(channel)
        for index in range(3):
            request = GenerationRequest(
                f"r{index}", tuple(prompt(index)), SamplingOptions(max_tokens=MAX_TOKENS)
            )
            predicted = plan.failure_point(request, MAX_TOKENS)
            assert predicted is not None
            responses, error = await until_error(failing.Generate(one(start(f"r{index}", prompt(index)))))
            assert [r.WhichOneof("event") for r in responses] == ["started"] + ["delta"] * predicted
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert from_rpc_error(error).reason == Reason.ENGINE_FAILED
            assert retry_delay_s(error) == RETRY_AFTER_S

            # Failover drill: the tokens sent stand, and a healthy pod resumes
            # from them to the same reply an unfailed generation gives.
            sent = tokens_of(responses)
            resumed = [
                r
                async for r in healthy.Generate(
                    one(start(f"r{index}", prompt(index), resume_output_token_ids=sent))
                )
            ]
            whole = [r async for r in healthy.Generate(one(start(f"w{index}", prompt(index))))]
            assert sent + tokens_of(resumed) == tokens_of(whole)
            assert resumed[-1].finished.usage.output_tokens == MAX_TOKENS - predicted

        # The failures freed their slots and blocks; the pod still serves.
        report = (await failing.GetLoad(pb.GetLoadRequest())).report
        assert (report.running, report.kv_cache_usage) == (0, 0.0)
        assert report.health == common_pb2.HEALTH_STATE_SERVING
        assert (await failing.Tokenize(pb.TokenizeRequest(text="still here"))).token_ids


async def failing_seeds(backend: SimBackend, seeds: range) -> dict[int, str]:
    """The seeds whose generation failed, with the failure's reason."""
    failed: dict[int, str] = {}
    for seed in seeds:
        request = GenerationRequest(
            f"s{seed}", tuple(prompt(0)), SamplingOptions(max_tokens=MAX_TOKENS, seed=seed)
        )
        try:
            generation = await collect(backend, request)
        except Unavailable as err:
            failed[seed] = err.reason
        else:
            assert generation.finished is not None and generation.finished.output_tokens == MAX_TOKENS
    return failed


@pytest.mark.asyncio
async def test_error_rate_half_fails_a_deterministic_subset_of_seeds() -> None:
    seeds = range(40)
    backend = SimBackend(dataclasses.replace(FAST, sim_error_rate=0.5))
    await backend.start()
    try:
        first = await failing_seeds(backend, seeds)
        second = await failing_seeds(backend, seeds)
    finally:
        await backend.close()
    assert first == second
    assert set(first.values()) == {Reason.ENGINE_FAILED}
    assert 0 < len(first) < len(seeds)
    plan = FaultPlan(error_rate=0.5)
    predicted = {
        seed
        for seed in seeds
        if plan.failure_point(
            GenerationRequest("any", tuple(prompt(0)), SamplingOptions(max_tokens=MAX_TOKENS, seed=seed)),
            MAX_TOKENS,
        )
        is not None
    }
    assert set(first) == predicted


@pytest.mark.asyncio
async def test_a_stalled_stream_holds_its_tokens_until_a_cancel_frees_the_slot() -> None:
    stall_after = 3
    stalled_pod = await start_engine(dataclasses.replace(FAST, sim_stall_after_tokens=stall_after))
    backend = stalled_pod.backend
    assert isinstance(backend, SimBackend)
    try:
        async with open_channel(stalled_pod.address) as channel:
            stub = stub_on(channel)
            call = stub.Generate()
            await call.write(start("wedged", prompt(0)))
            kinds = [(await call.read()).WhichOneof("event") for _ in range(1 + stall_after)]
            assert kinds == ["started"] + ["delta"] * stall_after
            # Unstalled, the rest of the reply would take a few milliseconds;
            # give it that chance, then show nothing more came.
            await asyncio.sleep(0.05)
            steps = backend.scheduler.steps
            await asyncio.sleep(0.02)
            assert backend.scheduler.steps == steps, "a stalled batch kept stepping"
            assert (await stub.GetLoad(pb.GetLoadRequest())).report.running == 1
            await call.write(pb.GenerateRequest(cancel=pb.GenerateCancel(request_id="wedged")))
            rest = []
            while (message := await call.read()) is not grpc.aio.EOF:
                rest.append(message)
            assert [r.WhichOneof("event") for r in rest] == ["finished"]
            finished = rest[0].finished
            assert finished.reason == common_pb2.FINISH_REASON_CANCELLED
            assert finished.usage.output_tokens == stall_after
            assert await call.code() == grpc.StatusCode.OK
            report = (await stub.GetLoad(pb.GetLoadRequest())).report
            assert (report.running, report.kv_cache_usage) == (0, 0.0)
    finally:
        await stalled_pod.stop(grace_s=0.5)


@pytest.mark.asyncio
async def test_the_crash_trigger_fires_once_on_the_nth_generation() -> None:
    completed: list[int] = []
    fired: list[int] = []  # which generation (1-based) each crash fired on
    crash_pod = await start_engine(
        dataclasses.replace(FAST, sim_crash_after_generations=3),
        on_crash=lambda: fired.append(len(completed) + 1),
    )
    try:
        async with open_channel(crash_pod.address) as channel:
            stub = stub_on(channel)
            for index in range(5):
                responses = [r async for r in stub.Generate(one(start(f"c{index}", prompt(index))))]
                # In-process, the callback stands in for the exit: the
                # generation itself runs on.
                assert responses[-1].finished.usage.output_tokens == MAX_TOKENS
                completed.append(index)
    finally:
        await crash_pod.stop(grace_s=0.5)
    assert fired == [3]


def ready_address(ready: Path) -> str | None:
    """The address in a pod's ready file; None until it is written."""
    if not ready.exists():
        return None
    return str(json.loads(ready.read_text())["address"])


async def wait_for_ready(process: asyncio.subprocess.Process, ready: Path, log: Path) -> str:
    """The address the pod process serves on, once it is ready (bounded)."""
    deadline = time.monotonic() + BOUND_S
    while (address := ready_address(ready)) is None:
        if process.returncode is not None or time.monotonic() > deadline:
            raise AssertionError(f"the pod did not become ready (exit {process.returncode}); see {log}")
        await asyncio.sleep(0.02)
    return address


@pytest.mark.asyncio
async def test_the_pod_process_exits_with_70_on_an_injected_crash(tmp_path: Path) -> None:
    ready, log = tmp_path / "engine.json", tmp_path / "engine.log"
    flags = ["--port", "0", "--ready-file", str(ready), "--sim-crash-after-generations", "1", "--insecure"]
    with log.open("w") as out:
        # A file, not a pipe: nobody drains a pipe while the test waits.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmmesh", "engine", *flags, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    try:
        address = await wait_for_ready(process, ready, log)
        async with open_channel(address) as channel:
            _, error = await until_error(
                stub_on(channel).Generate(one(start("boom", prompt(0))), timeout=BOUND_S)
            )
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        returncode = await asyncio.wait_for(process.wait(), BOUND_S)
        assert returncode == CRASH_EXIT_CODE, log.read_text()
        assert "injected crash" in log.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
