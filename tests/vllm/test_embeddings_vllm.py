"""A vLLM pod that embeds with vLLM's pooling runner: ``llmmesh engine
--backend vllm --embedding-backend vllm`` serving ``llmmesh-tiny-embed``
(built by ``llmmesh model build-tiny-embed``), checked against the same
model's mean-pooled hidden states computed by transformers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from llmmesh.v1 import embedding_service_pb2 as pb
from llmmesh.v1 import embedding_service_pb2_grpc as pb_grpc
from tests.vllm.conftest import VllmPod, build_model, start_pod, stop_pod

pytestmark = pytest.mark.vllm
MODEL = "llmmesh-tiny-embed"


@pytest.fixture(scope="module")
def embed_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("build-tiny-embed", tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def pod(
    tiny_model_dir: Path, embed_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPod]:
    running = start_pod(
        tiny_model_dir,
        tmp_path_factory.mktemp("embed-pod"),
        "--embedding-backend",
        "vllm",
        "--embedding-model-path",
        str(embed_model_dir),
    )
    try:
        yield running
    finally:
        stop_pod(running)


def _reference(model_dir: Path, text: str) -> list[float]:
    """Mean of the last hidden states, L2-normalised, by transformers."""
    import torch
    from transformers import AutoTokenizer, LlamaModel

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaModel.from_pretrained(model_dir, torch_dtype=torch.float32)
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**ids).last_hidden_state[0].mean(dim=0)
    return [float(x) for x in torch.nn.functional.normalize(hidden, dim=0)]


@pytest.mark.asyncio
async def test_the_pod_embeds_with_vllm_pooling(pod: VllmPod, embed_model_dir: Path) -> None:
    text = "the quick brown fox jumps over the lazy dog"
    async with grpc.aio.insecure_channel(pod.address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        info = await stub.GetEmbeddingInfo(pb.GetEmbeddingInfoRequest())
        assert (info.model, info.backend, info.dimensions) == (MODEL, "vllm", 256)
        resp = await stub.Embed(pb.EmbedRequest(model=MODEL, inputs=[pb.EmbeddingInput(text=text)] * 2))
        first, second = (list(e.values) for e in resp.embeddings)
        assert first == second and len(first) == 256
        assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-4)
        reference = _reference(embed_model_dir, text)
        assert sum(a * b for a, b in zip(first, reference, strict=True)) > 0.999
        short = await stub.Embed(
            pb.EmbedRequest(model=MODEL, inputs=[pb.EmbeddingInput(text=text)], dimensions=32)
        )
        cut = list(short.embeddings[0].values)
        norm = math.sqrt(sum(x * x for x in first[:32]))
        assert cut == pytest.approx([x / norm for x in first[:32]], abs=1e-5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(
                pb.EmbedRequest(model=MODEL, inputs=[pb.EmbeddingInput(text=text)], dimensions=512)
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
