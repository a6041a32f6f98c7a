"""The components of the edge's OpenAPI document: the schemas of its request
bodies and answers, and the OpenAI error object.

Request bodies and the conversation objects are described by their pydantic
models, the very ones the handlers validate and answer with; the
chat-completion, model, usage and health objects, which the handlers build
as plain dicts, are written out here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from edge.conversation_objects import (
    ConversationMessageRequest,
    ConversationObject,
    CreateConversationRequest,
    DeletedConversationObject,
    ListObject,
    MessageObject,
)
from edge.schemas import ChatCompletionRequest

Schema = dict[str, Any]
"""A JSON Schema, or any other object of the document."""

REF = "#/components/schemas/{model}"
STRING: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
_NULLABLE_STRING: Schema = {"type": ["string", "null"]}


def _object(properties: dict[str, Schema]) -> Schema:
    """An object with every one of ``properties`` always present."""
    return {"type": "object", "properties": properties, "required": list(properties)}


def _with_optional(schema: Schema, **properties: Schema) -> Schema:
    """``schema`` with ``properties`` that are present only sometimes."""
    return {**schema, "properties": {**schema["properties"], **properties}}


def ref(name: str) -> Schema:
    """A reference to the component schema ``name``."""
    return {"$ref": REF.format(model=name)}


_USAGE = _object(
    {
        "prompt_tokens": INT,
        "completion_tokens": INT,
        "total_tokens": INT,
        "prompt_tokens_details": _object({"cached_tokens": INT}),
    }
)

_FILTER_RESULTS: Schema = {
    "type": "object",
    "description": "Only when finish_reason is content_filter: the categories that blocked the reply.",
    "additionalProperties": _object({"filtered": {"const": True}}),
}

_WRITTEN_OUT: dict[str, Schema] = {
    "Error": _object(
        {
            "error": _object(
                {
                    "message": STRING,
                    "type": STRING,
                    "param": _NULLABLE_STRING,
                    "code": _NULLABLE_STRING,
                }
            )
        }
    ),
    "CompletionUsage": _USAGE,
    "ChatCompletion": _object(
        {
            "id": STRING,
            "object": {"const": "chat.completion"},
            "created": INT,
            "model": STRING,
            "system_fingerprint": _NULLABLE_STRING,
            "choices": {
                "type": "array",
                "items": _with_optional(
                    _object(
                        {
                            "index": INT,
                            "message": _object(
                                {
                                    "role": {"const": "assistant"},
                                    "content": STRING,
                                    "refusal": {"type": "null"},
                                }
                            ),
                            "logprobs": {"type": "null"},
                            "finish_reason": {"enum": ["stop", "length", "content_filter"]},
                        }
                    ),
                    content_filter_results=_FILTER_RESULTS,
                ),
            },
            "usage": ref("CompletionUsage"),
        }
    ),
    "Model": _object(
        {
            "id": STRING,
            "object": {"const": "model"},
            "created": INT,
            "owned_by": STRING,
            "tier": STRING,
            "context_window": INT,
            "pricing": _object({"input_per_1k_usd": STRING, "output_per_1k_usd": STRING}),
            "regions": {"type": "array", "items": STRING},
            "default_for_tiers": {"type": "array", "items": STRING},
        }
    ),
    "ModelList": _object(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
    ),
    "Usage": _object(
        {
            "object": {"const": "usage"},
            "period": STRING,
            "input_tokens": INT,
            "output_tokens": INT,
            "cost_usd": {"type": "string", "description": "An exact decimal string."},
            "requests": INT,
        }
    ),
    "PathHealth": {
        "type": "object",
        "properties": {
            "status": {"enum": ["ok", "unavailable"]},
            "global_plane": {"type": "boolean"},
            "regions": {"type": "object", "additionalProperties": {"type": "object"}},
        },
        "required": ["status", "global_plane", "regions"],
    },
    "Readiness": _object({"status": {"enum": ["ok", "unavailable"]}}),
    "StreamCancel": _object(
        {
            "id": STRING,
            "object": {"const": "stream.cancel"},
            "status": {"enum": ["cancelled", "already_finished"]},
        }
    ),
}

_MODELS: list[type[BaseModel]] = [
    ChatCompletionRequest,
    CreateConversationRequest,
    ConversationMessageRequest,
]
_OBJECTS: list[type[BaseModel]] = [
    ConversationObject,
    DeletedConversationObject,
    MessageObject,
    ListObject[ConversationObject],
    ListObject[MessageObject],
]


def component_schemas() -> tuple[dict[str, Schema], dict[type[BaseModel], Schema]]:
    """Every component schema by name, and the reference to each pydantic model's."""
    inputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(model, "validation") for model in _MODELS]
    outputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(model, "serialization") for model in _OBJECTS]
    refs, generated = models_json_schema([*inputs, *outputs], ref_template=REF)
    by_model = {model: dict(refs[(model, mode)]) for model, mode in [*inputs, *outputs]}
    return {**generated.get("$defs", {}), **_WRITTEN_OUT}, by_model
