"""``POST /v1/embeddings``: OpenAI's embeddings request becomes a
``RegionEmbeddingService.CreateEmbeddings`` call on the first region of the
tenant's zone that serves the model, and its vectors an OpenAI ``list`` of
``embedding`` objects.

The request as OpenAI defines it, every field honoured or refused with a
400 naming it: ``input`` (a string, an array of strings, an array of token
ids, or an array of token-id arrays; none empty; at most 2048 items),
``model``, ``encoding_format`` (``float``, or ``base64``: the vector's
little-endian float32 bytes, as OpenAI encodes them and the ``openai`` SDK
asks by default), ``dimensions`` (the vector is cut to that many leading
components and normalised again; more than the model has is a 400) and
``user`` (logged by the region). Any other field is a 400. Token ids are
embedded only with the ``x-llmmesh-token-ids`` header naming the model
(:mod:`core.embedding_tokens`): without it they are a 400 naming
``input``, so tiktoken ids (LangChain's default) never embed as the
model's own tokens.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmmesh.core.embedding_tokens import TOKEN_IDS_HEADER, token_ids_refusal
from llmmesh.core.errors import MeshError
from llmmesh.edge.caller import authenticate
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient, Metadata
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.unary_requests import answer_headers, bad_request, object_of_fields
from llmmesh.edge.zone_calls import call_in_zone
from llmmesh.v1 import embedding_service_pb2, embedding_service_pb2_grpc

MAX_INPUTS = 2048
_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A checked ``/v1/embeddings`` body."""

    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    encoding_format: str
    dimensions: int | None
    user: str


def _token_ids(item: list[object], where: str) -> tuple[int, ...]:
    ids: list[int] = []
    for token in item:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or token >= 2**32:
            raise bad_request(f"{where} must hold token ids, integers from 0 to 2^32-1", "input")
        ids.append(token)
    if not ids:
        raise bad_request(f"{where} is an empty token array", "input")
    return tuple(ids)


def _inputs(raw: object) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's four input shapes as texts and token tuples."""
    if isinstance(raw, str):
        if not raw:
            raise bad_request("input must not be an empty string", "input")
        return (raw,)
    if not isinstance(raw, list) or not raw:
        raise bad_request(
            "input must be a non-empty string, array of strings, array of token ids "
            "or array of token-id arrays",
            "input",
            "invalid_type",
        )
    if len(raw) > MAX_INPUTS:
        raise bad_request(f"input holds {len(raw)} items; at most {MAX_INPUTS} per request", "input")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return (_token_ids(raw, "input"),)
    items: list[str | tuple[int, ...]] = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if isinstance(item, str):
            if not item:
                raise bad_request(f"{where} must not be an empty string", "input")
            items.append(item)
        elif isinstance(item, list):
            items.append(_token_ids(item, where))
        else:
            raise bad_request(f"{where} must be a string or a token-id array", "input", "invalid_type")
    return tuple(items)


def parse_embeddings_request(body: object) -> EmbeddingsRequest:
    """The checked request, or a 400 naming the offending field."""
    body = object_of_fields(body, _FIELDS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(
            "model is required: the name of an embedding model", "model", "missing_required_parameter"
        )
    if "input" not in body:
        raise bad_request("input is required", "input", "missing_required_parameter")
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        raise bad_request("encoding_format must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions < 2**32
    ):
        raise bad_request("dimensions must be a positive integer", "dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("user must be a string", "user", "invalid_type")
    return EmbeddingsRequest(model, _inputs(body["input"]), str(encoding), dimensions, user or "")


def encode_vector(values: Sequence[float], encoding_format: str) -> list[float] | str:
    """A vector as OpenAI returns it: floats, or base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    return list(values)


class EmbeddingsHandler:
    """Serves ``/v1/embeddings`` through the tenant's zone."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient) -> None:
        self._settings = settings
        self._mesh = mesh

    async def handle(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        body = parse_embeddings_request(await read_json(request, self._settings.max_body_bytes))
        try:
            model = await self._mesh.models.resolve(body.model, principal.tenant.tier)
        except MeshError as err:
            # The registry's refusal is about the request's model field.
            err.metadata.setdefault("param", "model")
            raise
        declared = request.headers.get(TOKEN_IDS_HEADER)
        has_token_ids = any(not isinstance(item, str) for item in body.inputs)
        refusal = token_ids_refusal((body.model, model.name), declared, has_token_ids)
        if refusal is not None:
            raise bad_request(refusal, "input" if declared is None else TOKEN_IDS_HEADER)
        message = embedding_service_pb2.CreateEmbeddingsRequest(
            request_id="emb-" + secrets.token_hex(12), model=model.name, user=body.user
        )
        for item in body.inputs:
            if isinstance(item, str):
                message.inputs.add(text=item)
            else:
                message.inputs.add(tokens=embedding_service_pb2.EmbeddingTokens(ids=item))
        if body.dimensions is not None:
            message.dimensions = body.dimensions

        declaration: Metadata = ((TOKEN_IDS_HEADER, declared),) if declared is not None else ()

        async def create(
            channel: object, metadata: Metadata
        ) -> embedding_service_pb2.CreateEmbeddingsResponse:
            stub = embedding_service_pb2_grpc.RegionEmbeddingServiceStub(channel)
            response: embedding_service_pb2.CreateEmbeddingsResponse = await stub.CreateEmbeddings(
                message, metadata=metadata + declaration, timeout=_TIMEOUT_S
            )
            return response

        regions = await self._mesh.route(principal.tenant.id, model.name)
        answer, region = await call_in_zone(self._mesh, principal, regions, create)
        headers = answer_headers(answer.request_id, region, answer.rate_limit)
        tokens = answer.usage.input_tokens
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": encode_vector(e.values, body.encoding_format),
                    }
                    for i, e in enumerate(answer.embeddings)
                ],
                "model": answer.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
            headers=headers,
        )
