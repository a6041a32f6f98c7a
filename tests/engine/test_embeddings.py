"""The pod's embedding model: the simulator's hashed n-gram vectors, the
checks on a batch, and EmbeddingService over a real in-process pod."""

from __future__ import annotations

import math

import grpc
import grpc.aio
import pytest

from llmmesh.core.errors import InvalidArgument, NotFound
from llmmesh.engine.embedding import Embedder, normalised
from llmmesh.engine.embedding_sim import SimEmbeddingBackend, hashed_vector
from llmmesh.engine.server import start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.v1 import embedding_service_pb2 as pb
from llmmesh.v1 import embedding_service_pb2_grpc as pb_grpc

MODEL = "llmmesh-tiny-embed"


def _cosine(a: tuple[float, ...] | list[float], b: tuple[float, ...] | list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _embedder(dimensions: int = 256, max_tokens: int = 64) -> Embedder:
    return Embedder(SimEmbeddingBackend(MODEL, dimensions, max_tokens))


@pytest.mark.asyncio
async def test_vectors_are_unit_deterministic_and_similar_for_shared_words() -> None:
    embedder = _embedder()
    texts = ["the quick brown fox", "the quick brown fox", "a quick brown dog", "zebra umbrella 42"]
    vectors = [e.vector for e in await embedder.embed(MODEL, texts)]
    for vector in vectors:
        assert len(vector) == 256
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-9)
    assert vectors[0] == vectors[1]
    assert _cosine(vectors[0], vectors[2]) > _cosine(vectors[0], vectors[3])
    assert _cosine(vectors[0], vectors[2]) > 0.2


@pytest.mark.asyncio
async def test_a_text_and_its_token_ids_embed_the_same() -> None:
    embedder = _embedder()
    ids = await embedder.backend.tokenize("hello world")
    by_text, by_ids = await embedder.embed(MODEL, ["hello world", ids])
    assert by_text == by_ids
    assert by_text.input_tokens == len(ids) > 0


@pytest.mark.asyncio
async def test_dimensions_truncate_and_renormalise() -> None:
    embedder = _embedder()
    (full,) = await embedder.embed(MODEL, ["the quick brown fox"])
    (short,) = await embedder.embed(MODEL, ["the quick brown fox"], dimensions=16)
    assert len(short.vector) == 16
    assert short.vector == pytest.approx(normalised(full.vector, 16))
    assert math.isclose(sum(x * x for x in short.vector), 1.0, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("inputs", "dimensions", "param"),
    [
        ([], None, "input"),
        ([""], None, "input"),
        ([()], None, "input"),
        ([(1, 10**7)], None, "input"),
        (["word " * 100], None, "input"),
        (["fine"], 0, "dimensions"),
        (["fine"], 257, "dimensions"),
    ],
)
@pytest.mark.asyncio
async def test_bad_batches_are_refused_naming_the_param(
    inputs: list[str | tuple[int, ...]], dimensions: int | None, param: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await _embedder().embed(MODEL, inputs, dimensions)
    assert caught.value.metadata["param"] == param


@pytest.mark.asyncio
async def test_another_model_is_not_found() -> None:
    with pytest.raises(NotFound):
        await _embedder().embed("text-embedding-3-small", ["hi"])


def test_unrelated_token_bags_are_nearly_orthogonal_and_prefixes_keep_similarity() -> None:
    a = hashed_vector(list(range(40)), 256)
    b = hashed_vector(list(range(100, 140)), 256)
    shared = hashed_vector([*range(30), *range(100, 110)], 256)
    assert abs(_cosine(a, b)) < 0.25
    assert _cosine(a, shared) > 0.5
    # A 64-component prefix is a smaller projection of the same bags.
    assert _cosine(normalised(a, 64), normalised(shared, 64)) > 0.4
    assert abs(_cosine(normalised(a, 64), normalised(b, 64))) < 0.4


@pytest.mark.asyncio
async def test_embedding_service_on_a_pod() -> None:
    pod = await start_engine(EngineSettings(pod_id="emb-pod", insecure=True))
    try:
        async with grpc.aio.insecure_channel(pod.address) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            info = await stub.GetEmbeddingInfo(pb.GetEmbeddingInfoRequest())
            assert (info.model, info.backend, info.dimensions, info.pod_id) == (MODEL, "sim", 256, "emb-pod")
            resp = await stub.Embed(
                pb.EmbedRequest(
                    model=MODEL,
                    inputs=[
                        pb.EmbeddingInput(text="hello"),
                        pb.EmbeddingInput(tokens=pb.EmbeddingTokens(ids=[5, 6])),
                    ],
                    dimensions=8,
                )
            )
            assert [len(e.values) for e in resp.embeddings] == [8, 8]
            assert all(e.input_tokens > 0 for e in resp.embeddings)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Embed(pb.EmbedRequest(model=MODEL, inputs=[pb.EmbeddingInput()]))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await pod.stop(0.5)


@pytest.mark.asyncio
async def test_a_pod_without_embeddings_does_not_serve_the_service() -> None:
    pod = await start_engine(EngineSettings(pod_id="no-emb", insecure=True, embedding_backend="none"))
    try:
        async with grpc.aio.insecure_channel(pod.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.EmbeddingServiceStub(channel).GetEmbeddingInfo(pb.GetEmbeddingInfoRequest())
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await pod.stop(0.5)


def test_an_unknown_embedding_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="embedding_backend"):
        EngineSettings(embedding_backend="onnx")
