"""Speculative decoding (n-gram prompt lookup, a draft model) and a 32K context on a real
vLLM-CPU pod: one pod serving a tiny model built with 32 768 positions,
``--max-model-len 32768 --speculative-method ngram``. Greedy speculation is
lossless, so its output equals vLLM's own greedy output without it; a
prompt longer than the default 4 096-token window is served; what vLLM
cannot combine with speculation is refused by name."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine import tiny_model
from llmmesh.engine.sim.vocabulary import WORDS
from llmmesh.v1 import common_pb2 as common
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.vllm.conftest import VllmPod, start_pod, stop_pod

pytestmark = pytest.mark.vllm

LONG_CONTEXT = 32768
# Repeats give prompt lookup n-grams to find.
SHORT_PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = tiny_model.TinyModelSpec(context_window=LONG_CONTEXT)
    return tiny_model.build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-32k", spec)


@pytest.fixture(scope="module")
def speculating_pod(long_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmPod]:
    pod = start_pod(
        long_model_dir,
        tmp_path_factory.mktemp("pod"),
        "--max-num-seqs", "2",
        "--max-model-len", str(LONG_CONTEXT),
        "--speculative-method", "ngram",
        "--num-speculative-tokens", "3",
        # The random weights rarely repeat a 2-gram; any repeated token
        # is enough to draft from.
        "--prompt-lookup-min", "1",
        "--prompt-lookup-max", "3",
    )  # fmt: skip
    yield pod
    assert stop_pod(pod) == 0, pod.log()


@pytest_asyncio.fixture
async def stub(speculating_pod: VllmPod) -> AsyncIterator[pb_grpc.EngineServiceStub]:
    channel = open_channel(speculating_pod.address)
    yield pb_grpc.EngineServiceStub(channel)
    await channel.close()


async def generate(
    stub: pb_grpc.EngineServiceStub, request_id: str, prompt: str, **sampling: Any
) -> tuple[list[int], pb.GenerateFinished]:
    start = pb.GenerateStart(
        request_id=request_id,
        messages=[common.ChatMessage(role=common.CHAT_ROLE_USER, content=prompt)],
        sampling=common.SamplingParams(temperature=0.0, **sampling),
    )
    call = stub.Generate()
    await call.write(pb.GenerateRequest(start=start))
    token_ids: list[int] = []
    finished: pb.GenerateFinished | None = None
    while (response := await call.read()) is not grpc.aio.EOF:
        assert isinstance(response, pb.GenerateResponse)
        if response.WhichOneof("event") == "delta":
            token_ids.extend(response.delta.token_ids)
        elif response.WhichOneof("event") == "finished":
            finished = response.finished
    assert finished is not None
    return token_ids, finished


async def prompt_ids(stub: pb_grpc.EngineServiceStub, prompt: str) -> list[int]:
    response = await stub.Tokenize(
        pb.TokenizeRequest(
            messages=[common.ChatMessage(role=common.CHAT_ROLE_USER, content=prompt)],
            add_generation_prompt=True,
        )
    )
    return list(response.token_ids)


def spec_metric(metrics_url: str, name: str) -> float:
    """The sum of a vLLM speculative-decoding counter's samples."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.asyncio
async def test_greedy_speculation_equals_vllms_output_without_it(
    stub: pb_grpc.EngineServiceStub, speculating_pod: VllmPod, long_model_dir: Path
) -> None:
    tokens, finished = await generate(stub, "spec-greedy", SHORT_PROMPT, max_tokens=64, ignore_eos=True)
    assert len(tokens) == 64 and finished.usage.output_tokens == 64
    ids = await prompt_ids(stub, SHORT_PROMPT)
    command = [sys.executable, "-m", "tests.vllm.reference_generate", str(long_model_dir), "64"]
    done = await asyncio.to_thread(
        subprocess.run,
        [*command, json.dumps([ids])],
        capture_output=True,
        text=True,
        # vLLM's own start on a busy machine, as a pod's (conftest's STARTUP_TIMEOUT_S).
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # vLLM logs to stdout too; the answer is the one JSON line.
    [answer] = [line for line in done.stdout.splitlines() if line.startswith("[[")]
    [reference] = json.loads(answer)
    assert tokens == reference
    # The engine did speculate: prompt lookup proposed draft tokens (the
    # random weights accept few of them, which greedy equality shows is fine).
    assert spec_metric(speculating_pod.metrics_url, "vllm:spec_decode_num_draft_tokens_total") > 0


@pytest.mark.asyncio
async def test_a_prompt_beyond_4k_tokens_is_served_in_the_32k_window(stub: pb_grpc.EngineServiceStub) -> None:
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(6000))
    tokens, finished = await generate(stub, "spec-long", prompt, max_tokens=8, ignore_eos=True)
    assert finished.usage.input_tokens > 4096
    assert len(tokens) == 8


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"logit_bias": {300: 5.0}}, "logit_bias"),
        (
            {"response_format": common.ResponseFormat(type=common.RESPONSE_FORMAT_TYPE_JSON_OBJECT)},
            "response_format",
        ),
    ],
)
async def test_what_speculation_cannot_do_is_refused_by_name(
    stub: pb_grpc.EngineServiceStub, sampling: dict[str, Any], param: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, f"spec-refused-{param}", SHORT_PROMPT, max_tokens=4, **sampling)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(raised.value)
    assert error.metadata["param"] == param
    assert "speculative decoding" in error.message


@pytest.mark.asyncio
async def test_a_draft_model_speculates_without_changing_a_greedy_token(
    stub: pb_grpc.EngineServiceStub, long_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM-CPU runs a draft model too: a one-layer model with the same
    tokenizer proposes, the target verifies."""
    spec = tiny_model.TinyModelSpec(context_window=LONG_CONTEXT, num_layers=1)
    draft = tiny_model.build_tiny_model(tmp_path / "draft", spec)
    # The n-gram pod's greedy output, which equals vLLM's without speculation.
    expected, _ = await generate(stub, "draft-reference", SHORT_PROMPT, max_tokens=16, ignore_eos=True)
    pod = await asyncio.to_thread(
        start_pod,
        long_model_dir,
        tmp_path,
        "--max-num-seqs", "2",
        "--max-model-len", str(LONG_CONTEXT),
        "--speculative-method", "draft_model",
        "--speculative-model", str(draft),
        "--num-speculative-tokens", "3",
    )  # fmt: skip
    try:
        channel = open_channel(pod.address)
        try:
            draft_stub = pb_grpc.EngineServiceStub(channel)
            tokens, _ = await generate(draft_stub, "draft-1", SHORT_PROMPT, max_tokens=16, ignore_eos=True)
        finally:
            await channel.close()
        assert tokens == expected
        assert spec_metric(pod.metrics_url, "vllm:spec_decode_num_draft_tokens_total") > 0
    finally:
        assert await asyncio.to_thread(stop_pod, pod) == 0, pod.log()
