"""``EmbeddingService`` over an :class:`engine.embedding.Embedder`: thin
handlers that convert messages; the checks live in the embedder. A
``MeshError`` ends the call with its rich status."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

import grpc.aio

from llmmesh.core.errors import InvalidArgument, MeshError, Reason
from llmmesh.engine.embedding import Embedder, TextOrTokens
from llmmesh.v1 import embedding_service_pb2 as pb
from llmmesh.v1 import embedding_service_pb2_grpc as pb_grpc

EMBEDDING_SERVICE_NAME = "llmmesh.v1.EmbeddingService"

Context: TypeAlias = "grpc.aio.ServicerContext[object, object]"


def inputs_of(items: Iterable[pb.EmbeddingInput]) -> list[TextOrTokens]:
    """The proto inputs as texts and token tuples; INVALID_ARGUMENT (param
    ``input``) for an input that sets neither."""
    converted: list[TextOrTokens] = []
    for index, item in enumerate(items):
        kind = item.WhichOneof("input")
        if kind == "text":
            converted.append(item.text)
        elif kind == "tokens":
            converted.append(tuple(item.tokens.ids))
        else:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"input[{index}] has neither text nor tokens",
                metadata={"param": "input"},
            )
    return converted


class EmbeddingServicer(pb_grpc.EmbeddingServiceServicer):
    """Serves one pod's embedding model."""

    def __init__(self, embedder: Embedder, pod_id: str) -> None:
        self._embedder = embedder
        self._pod_id = pod_id

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        try:
            dimensions = request.dimensions if request.HasField("dimensions") else None
            embedded = await self._embedder.embed(request.model, inputs_of(request.inputs), dimensions)
        except MeshError as err:
            await err.abort(context)
        return pb.EmbedResponse(
            embeddings=[pb.Embedding(values=e.vector, input_tokens=e.input_tokens) for e in embedded],
            pod_id=self._pod_id,
        )

    async def GetEmbeddingInfo(
        self, request: pb.GetEmbeddingInfoRequest, context: Context
    ) -> pb.GetEmbeddingInfoResponse:
        info = self._embedder.info()
        return pb.GetEmbeddingInfoResponse(
            pod_id=self._pod_id,
            model=info.model,
            backend=info.backend,
            dimensions=info.dimensions,
            max_input_tokens=info.max_input_tokens,
            vocab_size=info.vocab_size,
            max_batch_inputs=info.max_batch_inputs,
        )
