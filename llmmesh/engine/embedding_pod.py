"""Which embedding model a pod runs beside its generation engine, and how
its ``EmbeddingService`` is added to the pod's server.

A simulator pod embeds with the simulator's hashed n-gram model
(:mod:`engine.embedding_sim`) by default, at no memory cost; a vLLM pod
embeds only when asked (``--embedding-backend vllm``), since that starts a
second vLLM engine in pooling mode (:mod:`engine.embedding_vllm`).
"""

from __future__ import annotations

import grpc.aio

from llmmesh.engine.embedding import Embedder, EmbeddingBackend, EmbeddingSettings
from llmmesh.engine.embedding_servicer import EmbeddingServicer
from llmmesh.engine.embedding_sim import SimEmbeddingBackend
from llmmesh.v1 import embedding_service_pb2_grpc


def create_embedding_backend(settings: EmbeddingSettings, backend: str) -> EmbeddingBackend | None:
    """The embedding backend ``settings`` ask for on a pod whose generation
    backend is ``backend``, not started; None for none. ValueError for an
    unknown runner; ImportError-free for the simulator."""
    runner = settings.embedding_runner(backend)
    if runner == "none":
        return None
    if runner == "sim":
        return SimEmbeddingBackend(
            settings.embedding_model, settings.embedding_dimensions, settings.embedding_max_input_tokens
        )
    from llmmesh.engine.embedding_vllm import VllmEmbeddingBackend

    return VllmEmbeddingBackend(settings)


async def start_embedder(settings: EmbeddingSettings, backend: str) -> Embedder | None:
    """The pod's embedder with its model loaded, or None when it embeds nothing."""
    embedding = create_embedding_backend(settings, backend)
    if embedding is None:
        return None
    await embedding.start()
    return Embedder(embedding)


def add_embedding_service(server: grpc.aio.Server, embedder: Embedder, pod_id: str) -> None:
    embedding_service_pb2_grpc.add_EmbeddingServiceServicer_to_server(
        EmbeddingServicer(embedder, pod_id), server
    )
