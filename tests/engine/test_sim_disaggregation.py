"""Prefill/decode disaggregation in the simulator: a prefill pod computes
the prompt and hands over a KV transfer; a decode pod takes it, holds the
prompt's blocks and generates the same reply a whole-turn pod would, billed
as cached only for the prefill pod's own hits. Also through gRPC: the
phases, the pod's role, and the requests a role refuses."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.backend import GeneratedTokens, GenerationRequest, KvTransferSpec, SamplingOptions
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.kv_blocks import full_block_hashes
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.support import FAST, collect

PROMPT = tuple(range(10, 47))  # 37 tokens: 9 full blocks of 4 and a tail


@pytest_asyncio.fixture
async def pods() -> AsyncIterator[dict[str, SimBackend]]:
    backends = {
        role: SimBackend(dataclasses.replace(FAST, pod_id=f"{role}-0", pod_role=role))
        for role in ("prefill", "decode", "both")
    }
    for backend in backends.values():
        await backend.start()
    yield backends
    for backend in backends.values():
        await backend.close()


def request(request_id: str, **fields: object) -> GenerationRequest:
    return GenerationRequest(request_id, PROMPT, SamplingOptions(max_tokens=12, seed=7), **fields)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_prefill_phase_streams_nothing_and_hands_over_the_kv_cache(
    pods: dict[str, SimBackend],
) -> None:
    prefill = await collect(pods["prefill"], request("turn-1", prefill_only=True))
    assert prefill.started is not None and prefill.started.prompt_tokens == len(PROMPT)
    assert not [event for event in prefill.events if isinstance(event, GeneratedTokens)]
    assert prefill.finished is not None and prefill.finished.output_tokens == 0
    assert prefill.finished.kv_transfer == KvTransferSpec(
        source_pod_id="prefill-0",
        source_request_id="turn-1",
        prompt_tokens=len(PROMPT),
        blocks=10,
        cached_prompt_tokens=0,
    )


@pytest.mark.asyncio
async def test_the_decode_phase_generates_what_a_whole_turn_pod_does(pods: dict[str, SimBackend]) -> None:
    prefill = await collect(pods["prefill"], request("turn-2", prefill_only=True))
    assert prefill.finished is not None and prefill.finished.kv_transfer is not None
    decode_pod = pods["decode"]
    hits_before = decode_pod.pool.hit_tokens
    decoded = await collect(decode_pod, request("turn-2", kv_transfer=prefill.finished.kv_transfer))
    whole = await collect(pods["both"], request("turn-2"))
    assert decoded.token_ids == whole.token_ids and len(decoded.token_ids) == 12
    # The prompt's full blocks arrived; the transfer is not billed as a cache hit.
    assert set(full_block_hashes(PROMPT, FAST.block_size)) <= decode_pod.pool.resident_hashes()
    assert decoded.started is not None and decoded.started.cached_prompt_tokens == 0
    assert decoded.finished is not None and decoded.finished.cached_prompt_tokens == 0
    # Hitting the blocks it received is no prefix-cache hit of the decode pod.
    assert decode_pod.pool.hit_tokens == hits_before


@pytest.mark.asyncio
async def test_a_repeated_prompt_is_billed_with_the_prefill_pods_own_hits(
    pods: dict[str, SimBackend],
) -> None:
    await collect(pods["prefill"], request("warm", prefill_only=True))
    again = await collect(pods["prefill"], request("turn-3", prefill_only=True))
    assert again.finished is not None and again.finished.kv_transfer is not None
    assert again.finished.kv_transfer.cached_prompt_tokens == 9 * FAST.block_size
    decoded = await collect(pods["decode"], request("turn-3", kv_transfer=again.finished.kv_transfer))
    assert decoded.finished is not None and decoded.finished.cached_prompt_tokens == 9 * FAST.block_size


@pytest_asyncio.fixture
async def decode_pod() -> AsyncIterator[EnginePod]:
    pod = await start_engine(dataclasses.replace(FAST, pod_id="decode-9", pod_role="decode"))
    yield pod
    await pod.stop(grace_s=0.5)


async def stream(stub: pb_grpc.EngineServiceStub, start: pb.GenerateStart) -> list[pb.GenerateResponse]:
    call = stub.Generate()
    await call.write(pb.GenerateRequest(start=start))
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        assert isinstance(response, pb.GenerateResponse)
        responses.append(response)
    return responses


@pytest.mark.asyncio
async def test_a_decode_pod_states_its_role_and_refuses_what_it_cannot_take(decode_pod: EnginePod) -> None:
    channel = open_channel(decode_pod.address)
    stub = pb_grpc.EngineServiceStub(channel)
    try:
        info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert info.role == pb.POD_ROLE_DECODE
        sampling = common_pb2.SamplingParams(max_tokens=4)
        cases = [
            (
                pb.GenerateStart(
                    request_id="p", prompt_token_ids=PROMPT, sampling=sampling, prefill_only=True
                ),
                "prefill_only",
            ),
            (
                pb.GenerateStart(
                    request_id="short",
                    prompt_token_ids=PROMPT,
                    sampling=sampling,
                    kv_transfer=pb.KvTransfer(source_pod_id="prefill-0", prompt_tokens=5, blocks=2),
                ),
                "kv_transfer",
            ),
        ]
        for start, param in cases:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stream(stub, start)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert from_rpc_error(refused.value).metadata["param"] == param
        handle = pb.KvTransfer(source_pod_id="prefill-0", prompt_tokens=len(PROMPT), blocks=10)
        start = pb.GenerateStart(
            request_id="ok", prompt_token_ids=PROMPT, sampling=sampling, kv_transfer=handle
        )
        responses = await stream(stub, start)
        assert responses[-1].finished.usage.output_tokens == 4
    finally:
        await channel.close()


def test_a_pod_role_is_one_of_three() -> None:
    with pytest.raises(ValueError, match="pod_role"):
        EngineSettings(pod_role="router")
