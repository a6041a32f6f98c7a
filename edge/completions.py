"""``POST /v1/chat/completions``: an OpenAI request becomes a ChatService
turn on the tenant's region, and its events become SSE chunks or one
``chat.completion``."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge import metrics
from edge.chunks import DONE, ChunkStream, completion_object
from edge.errors import OpenAIError, from_mesh_error
from edge.mesh_client import MeshClient, Principal
from edge.schemas import parse_chat_request
from edge.settings import EdgeSettings
from edge.turns import OpenTurn, open_turn
from llmmesh import apikeys
from llmmesh.errors import MeshError
from llmmesh.model_resolver import ModelResolver
from llmmesh.v1 import chat_service_pb2


async def authenticate(request: Request, mesh: MeshClient) -> Principal:
    """The caller behind the request's bearer key, or a 401."""
    secret = apikeys.bearer_secret(request.headers.get("authorization"))
    if secret is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="missing_api_key",
        )
    return await mesh.authenticate(secret)


async def read_json(request: Request, limit: int) -> object:
    """The decoded JSON body, or a 400 naming what is wrong with it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise OpenAIError(400, f"request body larger than {limit} bytes", code="request_too_large")
    raw = await request.body()
    if len(raw) > limit:
        raise OpenAIError(400, f"request body larger than {limit} bytes", code="request_too_large")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc


class CompletionsHandler:
    """Serves chat completions through the mesh."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient) -> None:
        self._settings = settings
        self._mesh = mesh
        self._models = ModelResolver(mesh.registry)

    async def handle(self, request: Request) -> Response:
        arrived = time.monotonic()
        principal = await authenticate(request, self._mesh)
        req = parse_chat_request(await read_json(request, self._settings.max_body_bytes))
        model = await self._models.resolve(req.model, principal.tenant.tier)
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        start = chat_service_pb2.ChatStart(
            request_id=completion_id,
            model=model.name,
            messages=req.to_messages(),
            sampling=req.to_sampling(),
            user=req.user or "",
        )
        turn = await open_turn(
            self._mesh, principal, start, model.name, self._settings.first_event_timeout_ms / 1000
        )
        headers = {"x-request-id": completion_id, "x-llmmesh-region": turn.started.region}
        created = int(time.time())
        if req.stream:
            chunks = ChunkStream(completion_id, created, model.name, req.include_usage())
            return StreamingResponse(
                self._stream(turn, chunks, arrived),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        return await self._complete(turn, completion_id, created, model.name, headers)

    async def _stream(self, turn: OpenTurn, chunks: ChunkStream, arrived: float) -> AsyncIterator[bytes]:
        first_token = True
        try:
            yield chunks.role()
            async for delta in turn.deltas():
                if first_token:
                    metrics.TIME_TO_FIRST_TOKEN.observe(time.monotonic() - arrived)
                    first_token = False
                metrics.OUTPUT_TOKENS.inc(len(delta.token_ids))
                yield chunks.content(delta.sequence, delta.text)
            yield chunks.finish(turn.reason)
            if chunks.include_usage:
                yield chunks.usage(turn.usage)
            yield DONE
        except MeshError as err:
            error = from_mesh_error(err)
            metrics.STREAM_ERRORS.labels(code=error.code or "unknown").inc()
            # An error mid-stream ends the stream without [DONE], as OpenAI does.
            yield chunks.error(error.body())
        finally:
            turn.close()

    async def _complete(
        self, turn: OpenTurn, completion_id: str, created: int, model: str, headers: dict[str, str]
    ) -> Response:
        try:
            text = "".join([delta.text async for delta in turn.deltas()])
        finally:
            turn.close()
        body = completion_object(completion_id, created, model, text, turn.reason, turn.usage)
        return JSONResponse(body, headers=headers)
