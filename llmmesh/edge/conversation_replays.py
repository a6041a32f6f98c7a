"""Idempotent conversation turns: a client's id for a turn (the
``Idempotency-Key`` header or ``client_message_id``) becomes the turn's
request id, so a retried POST makes no second turn and no second usage
record (the region takes a tenant's request id once).

A retry of a turn that has ended answers with the reply the region stored,
as a ``chat.completion`` or as its SSE chunks; a retry while the turn still
runs is a 409 ``idempotency_key_in_use``. A turn that never started (its
region failed before answering) is simply run again under the same id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llmmesh.edge.chunks import DONE, FINISH_REASONS, ChunkStream, SseEvent, usage_object, with_id
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.reply_parts import tool_call_objects
from llmmesh.v1 import chat_service_pb2, common_pb2

HEADER = "idempotency-key"
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def client_turn_id(request: Request, body_id: str | None) -> str | None:
    """The client's id of the turn, from the ``Idempotency-Key`` header or
    ``client_message_id``; a 400 when malformed or when the two differ."""
    header = request.headers.get(HEADER)
    if header is not None and not _KEY.match(header):
        raise OpenAIError(
            400,
            "the Idempotency-Key header must be 1 to 255 printable ASCII characters",
            param="Idempotency-Key",
            code="invalid_value",
        )
    if header is not None and body_id is not None and header != body_id:
        raise OpenAIError(
            400,
            "the Idempotency-Key header and client_message_id differ",
            param="client_message_id",
            code="invalid_value",
        )
    return header if header is not None else body_id


def turn_request_id(conversation_id: str, client_id: str) -> str:
    """The request id of the client's turn in a conversation: the same for
    every retry, and one no other conversation's turn of the tenant shares."""
    digest = hashlib.sha256(f"{conversation_id}\x00{client_id}".encode()).hexdigest()
    return f"chatcmpl-{digest[:40]}"


def in_progress() -> OpenAIError:
    return OpenAIError(
        409,
        "a request with this idempotency key is still running; retry when it has ended",
        param="Idempotency-Key",
        code="idempotency_key_in_use",
    )


def replay(
    request_id: str,
    stored: list[chat_service_pb2.StoredMessage],
    *,
    asked: str | None,
    stream: bool,
    include_usage: bool,
    headers: dict[str, str],
    event_ids: bool = False,
) -> Response:
    """The answer of an ended turn again, from what it stored; a 409 while
    it has stored no reply yet, and a 422 when the retry asks something else
    (``asked``, its user text) than the turn stored under the key. A stream
    has ``id:`` lines with ``event_ids`` (:mod:`edge.streams.framing`)."""
    question = next((m for m in stored if m.role == common_pb2.CHAT_ROLE_USER), None)
    if question is not None and asked is not None and question.content != asked:
        raise OpenAIError(
            422,
            "this idempotency key was used for another message; use a new key for a new message",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    reply = next((m for m in stored if m.role == common_pb2.CHAT_ROLE_ASSISTANT), None)
    if reply is None:
        raise in_progress()
    usage = common_pb2.TokenUsage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens)
    headers = {**headers, "x-request-id": request_id, "x-llmmesh-replayed": "true"}
    created = reply.create_time.seconds
    if stream:
        chunks = ChunkStream(request_id, created, reply.model, include_usage)
        events: list[SseEvent] = [chunks.role()]
        parts = [
            common_pb2.ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments)
            for i, c in enumerate(reply.tool_calls)
        ]
        if reply.content or parts:
            delta = chat_service_pb2.ChatDelta(sequence=1, text=reply.content, tool_calls=parts)
            events.append(chunks.delta(delta))
        events.append(chunks.finish(reply.finish_reason))
        if include_usage:
            events.append(chunks.usage(usage))
        frames = [with_id(e.event_id, e.frame) if event_ids else e.frame for e in events]
        frames.append(DONE)

        async def body() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame

        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
    message: dict[str, object] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["content"] = reply.content or None
        message["tool_calls"] = tool_call_objects(reply.tool_calls)
    body_object = {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": reply.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": FINISH_REASONS.get(reply.finish_reason, "stop"),
            }
        ],
        "usage": usage_object(usage),
    }
    return JSONResponse(body_object, headers=headers)
