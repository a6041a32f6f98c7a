"""The edge's OpenAPI 3.1 document, served at ``GET /openapi.json``: every
operation, its parameters, request body and answers, errors included (as the
OpenAI error object). The schemas are in :mod:`edge.openapi.components`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from pydantic import BaseModel

from llmmesh import __version__
from llmmesh.edge.conversation_objects import (
    BranchObject,
    ConversationMessageRequest,
    ConversationObject,
    CreateConversationRequest,
    DeletedConversationObject,
    ListObject,
    MessageObject,
    RegenerateRequest,
)
from llmmesh.edge.conversations import DEFAULT_LIMIT, MAX_LIMIT
from llmmesh.edge.openapi import files as openapi_files
from llmmesh.edge.openapi import responses as openapi_responses
from llmmesh.edge.openapi import text as openapi_text
from llmmesh.edge.openapi import vectors as openapi_vectors
from llmmesh.edge.openapi import web as openapi_web
from llmmesh.edge.openapi.components import INT, STRING, Schema, component_schemas, ref
from llmmesh.edge.response_request import ResponseRequest
from llmmesh.edge.schemas import ChatCompletionRequest
from llmmesh.edge.text_completions import TextCompletionRequest

_REQUEST_ID: Schema = {
    "description": "The client's own x-request-id when it sent a plain token"
    " (at most 128 of A-Z a-z 0-9 . _ : -), else a fresh one.",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}


def _error(description: str) -> Schema:
    return {
        "description": description,
        "content": {"application/json": {"schema": ref("Error")}},
        "headers": {
            "x-request-id": _REQUEST_ID,
            "retry-after": {
                "description": "Seconds to wait before retrying (429 and 503).",
                "schema": {"type": "string"},
            },
            "retry-after-ms": {
                "description": "Milliseconds to wait before retrying: retry-after's wait plus up to a "
                "quarter more at random, so clients refused together spread out.",
                "schema": {"type": "string"},
            },
        },
    }


_ERRORS: dict[str, Schema] = {
    "400": _error("The request is invalid; param names the culprit."),
    "401": _error("No API key, or one that is not valid."),
    "403": _error("The key may not do this, or no region of its zone serves."),
    "404": _error("Nothing with that id is visible to the key."),
    "409": _error("A conflicting request id."),
    "429": _error("A rate limit or the monthly quota is reached."),
    "503": _error("The mesh cannot serve now; retry after retry-after."),
}

_TURN_HEADERS: dict[str, Schema] = {
    name: {"description": description, "schema": {"type": "string"}}
    for name, description in (
        ("x-request-id", "The completion id, also the stream id for resuming."),
        ("x-llmmesh-region", "The region that served the turn."),
        ("x-llmmesh-route-reason", "Why its model served: requested, default, difficulty, budget, fallback."),
        ("x-llmmesh-route-model", "The model that served the turn (auto's choice, or a fallback's)."),
        ("x-llmmesh-route-detail", "The region's explanation: the difficulty score and what moved it."),
        ("x-ratelimit-limit-requests", "Requests the key may make per minute (when limited)."),
        ("x-ratelimit-remaining-requests", "Requests left in the window."),
        ("x-ratelimit-reset-requests", 'Time until the request window is clear, e.g. "1s", "6m0s".'),
        ("x-ratelimit-limit-tokens", "Tokens the key may use per minute (when limited)."),
        ("x-ratelimit-remaining-tokens", "Tokens left in the window."),
        ("x-ratelimit-reset-tokens", "Time until the token window is clear."),
        ("x-llmmesh-parent-message-id", "Of a conversation turn: the stored message it follows."),
        ("x-llmmesh-context-summarised-turns", "Of a conversation turn: old turns its summary stood for."),
        ("x-llmmesh-context-dropped-messages", "Of a conversation turn: history left out to fit the window."),
        ("x-llmmesh-replayed", 'Of a retried message: "true" when answered from the stored reply.'),
    )
}

# OpenAPI 3.1 has the schema of an event stream describe each of its events.
_SSE: Schema = {
    "description": "`chat.completion.chunk` events (components/schemas/ChatCompletionChunk), ending"
    " in `data: [DONE]`; each with an `id:` line only for a client that opts into event ids"
    " (x-llmmesh-event-ids or x-llmmesh-resumable: true, or Last-Event-ID on a resume).",
    "schema": {
        "type": "object",
        "properties": {"data": STRING, "id": STRING, "event": STRING, "retry": INT},
        "required": ["data"],
    },
}


def _json(description: str, schema: Schema) -> Schema:
    return {
        "description": description,
        "headers": {"x-request-id": _REQUEST_ID},
        "content": {"application/json": {"schema": schema}},
    }


def _turn_responses(whole: str = "ChatCompletion", sse: Schema = _SSE) -> dict[str, Schema]:
    return {
        "200": {
            "description": f"The reply: one `{whole}`, or an SSE stream when `stream` is true.",
            "headers": _TURN_HEADERS,
            "content": {"application/json": {"schema": ref(whole)}, "text/event-stream": sse},
        },
        **_ERRORS,
    }


def _operation(
    summary: str,
    responses: dict[str, Schema],
    *,
    body: tuple[Schema, Schema] | None = None,
    parameters: list[Schema] | None = None,
    public: bool = False,
) -> Schema:
    op: Schema = {"summary": summary, "responses": responses}
    if body is not None:
        schema, example = body
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema, "example": example}},
        }
    if parameters:
        op["parameters"] = parameters
    if public:
        op["security"] = []
    return op


_CONVERSATION_ID: Schema = {
    "name": "conversation_id",
    "in": "path",
    "required": True,
    "description": 'A conversation id, "conv_<zone>_<home region>_<random>".',
    "schema": {"type": "string", "pattern": "^conv_[a-z][a-z0-9]*_[a-z][a-z0-9-]*_[0-9a-f]+$"},
    "example": "conv_us_us-east_0123456789abcdef01234567",
}
_CHAT_EXAMPLE: Schema = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Hello!"}],
    "max_tokens": 16,
}
_MESSAGE_EXAMPLE: Schema = {
    "content": "Where should I go in May?",
    "max_tokens": 16,
    "stream": True,
    "stream_options": {"include_usage": True},
}
_MODEL: Schema = {
    "name": "model",
    "in": "path",
    "required": True,
    "description": "The model's name, as GET /v1/models lists it.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:/-]*$", "maxLength": 128},
    "example": "llmmesh-tiny",
}
_STREAM_ID: Schema = {
    "name": "stream_id",
    "in": "path",
    "required": True,
    "description": "The id of the chat completion that started the stream.",
    "schema": STRING,
}
_IDEMPOTENCY_KEY: Schema = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "The client's id of the turn (as client_message_id): a retry makes no second turn.",
    "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
}
_LEAF_ID: Schema = {
    "name": "leaf_id",
    "in": "query",
    "description": "List the branch ending at this message instead of the current one.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
}
_MESSAGE_ID: Schema = {
    "name": "message_id",
    "in": "path",
    "required": True,
    "description": "A stored assistant message (or the user message to answer again).",
    "schema": {"type": "string"},
}

_PAGE = [
    {
        "name": "limit",
        "in": "query",
        "description": f"Items per page, {DEFAULT_LIMIT} unless given.",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
    },
    {
        "name": "after",
        "in": "query",
        "description": "Start after this item: the previous page's last_id.",
        "schema": STRING,
    },
]


def _paths(models: Mapping[type[BaseModel], Schema]) -> dict[str, Schema]:
    """Every operation; ``models`` holds the references to the pydantic models' schemas."""
    conversation = _json("The conversation.", models[ConversationObject])
    return {
        "/v1/chat/completions": {
            "post": _operation(
                "Create a chat completion.",
                _turn_responses(),
                body=(models[ChatCompletionRequest], _CHAT_EXAMPLE),
            )
        },
        "/v1/models": {
            "get": _operation("List the models.", {"200": _json("The models.", ref("ModelList")), **_ERRORS})
        },
        "/v1/models/{model}": {
            "get": _operation(
                "Get one model; 404 model_not_found when there is none of that name.",
                {"200": _json("The model.", ref("Model")), **_ERRORS},
                parameters=[_MODEL],
            )
        },
        "/v1/embeddings": {
            "post": _operation(
                "Embed texts or token arrays with an embedding model of the tenant's zone.",
                {"200": _json("The vectors.", ref("EmbeddingList")), **_ERRORS},
                body=openapi_vectors.body("EmbeddingsRequest"),
            )
        },
        "/v1/moderations": {
            "post": _operation(
                "Classify texts with the region's safety backends (OpenAI's category names).",
                {"200": _json("The verdicts.", ref("Moderation")), **_ERRORS},
                body=openapi_vectors.body("ModerationRequest"),
            )
        },
        "/v1/completions": {
            "post": _operation(
                "Create a legacy text completion (the prompt is sent as one user message).",
                _turn_responses("TextCompletion", openapi_text.SSE),
                body=(models[TextCompletionRequest], openapi_text.EXAMPLE),
            )
        },
        **openapi_responses.paths(models[ResponseRequest], _ERRORS),
        "/v1/usage": {
            "get": _operation(
                "The key's tenant's billed usage in one month.",
                {"200": _json("The usage.", ref("Usage")), **_ERRORS},
                parameters=[
                    {
                        "name": "period",
                        "in": "query",
                        "description": 'The month, "YYYY-MM"; the current one when absent.',
                        "schema": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"},
                    }
                ],
            )
        },
        "/v1/conversations": {
            "post": _operation(
                "Create a conversation in the tenant's zone.",
                {"200": conversation, **_ERRORS},
                body=(
                    models[CreateConversationRequest],
                    {"title": "Trip", "system_prompt": "Answer briefly."},
                ),
            ),
            "get": _operation(
                "List the tenant's conversations, newest first.",
                {"200": _json("A page.", models[ListObject[ConversationObject]]), **_ERRORS},
                parameters=_PAGE,
            ),
        },
        "/v1/conversations/{conversation_id}": {
            "parameters": [_CONVERSATION_ID],
            "get": _operation("Get a conversation.", {"200": conversation, **_ERRORS}),
            "delete": _operation(
                "Delete a conversation (soft: every later read answers 404).",
                {"200": _json("Deleted.", models[DeletedConversationObject]), **_ERRORS},
            ),
        },
        "/v1/conversations/{conversation_id}/messages": {
            "parameters": [_CONVERSATION_ID],
            "post": _operation(
                "Send the next message; the reply is a chat completion, streamed when asked.",
                _turn_responses(),
                body=(models[ConversationMessageRequest], _MESSAGE_EXAMPLE),
                parameters=[_IDEMPOTENCY_KEY],
            ),
            "get": _operation(
                "List one branch of a conversation's messages, oldest first: the current one, or"
                " the one ending at leaf_id.",
                {"200": _json("A page.", models[ListObject[MessageObject]]), **_ERRORS},
                parameters=[*_PAGE, _LEAF_ID],
            ),
        },
        "/v1/conversations/{conversation_id}/messages/{message_id}/regenerate": {
            "parameters": [_CONVERSATION_ID, _MESSAGE_ID],
            "post": _operation(
                "A new reply in place of a stored one (or to a stored user message): a new branch."
                " The reply is a chat completion, streamed when asked.",
                _turn_responses(),
                body=(models[RegenerateRequest], {"stream": True}),
                parameters=[_IDEMPOTENCY_KEY],
            ),
        },
        "/v1/conversations/{conversation_id}/branches": {
            "parameters": [_CONVERSATION_ID],
            "get": _operation(
                "List a conversation's branches, the newest first.",
                {"200": _json("A page.", models[ListObject[BranchObject]]), **_ERRORS},
                parameters=_PAGE,
            ),
        },
        "/v1/streams/{stream_id}": {
            "get": _operation(
                "Resume a stream after the event named by Last-Event-ID or starting_after.",
                {
                    "200": {"description": "The stream's events.", "content": {"text/event-stream": _SSE}},
                    **_ERRORS,
                },
                parameters=[
                    _STREAM_ID,
                    {
                        "name": "starting_after",
                        "in": "query",
                        "description": "Replay the events after this one. Events are numbered from 0"
                        " with or without id: lines, so a client that read K events sends K-1.",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "As starting_after; the SSE reconnection header.",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                    },
                ],
            )
        },
        "/v1/streams/{stream_id}/cancel": {
            "post": _operation(
                "Stop a generation; the tokens produced are billed.",
                {"200": _json("Stopped, or already over.", ref("StreamCancel")), **_ERRORS},
                parameters=[_STREAM_ID],
            )
        },
        "/healthz": {
            "get": _operation(
                "Whole-path health: the global plane and a region reaching a serving engine pod.",
                {
                    "200": _json("Healthy.", ref("PathHealth")),
                    "503": _json("Unhealthy.", ref("PathHealth")),
                },
                public=True,
            )
        },
        "/readyz": {
            "get": _operation(
                "Readiness: the stream log's Redis answers, and the global plane has not been "
                "unreachable past global_outage_grace_s; each dependency with its reason.",
                {"200": _json("Ready.", ref("Readiness")), "503": _json("Not ready.", ref("Readiness"))},
                public=True,
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus metrics.",
                {"200": {"description": "Text exposition.", "content": {"text/plain": {"schema": STRING}}}},
                public=True,
            )
        },
        "/docs": {
            "get": _operation(
                "This document as an HTML reference.",
                {"200": {"description": "HTML.", "content": {"text/html": {"schema": STRING}}}},
                public=True,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "This document.", {"200": _json("OpenAPI 3.1.", {"type": "object"})}, public=True
            )
        },
        **openapi_files.paths(_ERRORS),
        **openapi_web.paths(_ERRORS),
    }


@cache
def openapi_document() -> Schema:
    """The document (built once; it depends only on the code)."""
    schemas, model_refs = component_schemas()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmmesh edge",
            "version": __version__,
            "description": "OpenAI-compatible chat completions (tools, structured output, logprobs),"
            " legacy text completions, responses,"
            " embeddings, moderations, conversations and resumable streams.",
        },
        "paths": _paths(model_refs),
        "components": {
            "schemas": {
                **schemas,
                **openapi_vectors.SCHEMAS,
                **openapi_files.SCHEMAS,
                **openapi_text.SCHEMAS,
                **openapi_responses.SCHEMAS,
                **openapi_web.SCHEMAS,
            },
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer"},
                **openapi_web.SECURITY_SCHEMES,
            },
        },
        "security": [{"apiKey": []}],
    }
