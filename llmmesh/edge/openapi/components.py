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
from llmmesh.edge.response_request import ResponseRequest
from llmmesh.edge.schemas import ChatCompletionRequest
from llmmesh.edge.text_completions import TextCompletionRequest

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
                            "message": _with_optional(
                                _object(
                                    {
                                        "role": {"const": "assistant"},
                                        "content": {
                                            "type": ["string", "null"],
                                            "description": "Null when the reply is only tool calls.",
                                        },
                                        "refusal": {"type": "null"},
                                    }
                                ),
                                tool_calls={"type": "array", "items": ref("ToolCall")},
                            ),
                            "logprobs": {
                                "oneOf": [ref("ChoiceLogprobs"), {"type": "null"}],
                                "description": "With logprobs: true.",
                            },
                            "finish_reason": ref("FinishReason"),
                        }
                    ),
                    content_filter_results=_FILTER_RESULTS,
                ),
            },
            "usage": ref("CompletionUsage"),
        }
    ),
    "FinishReason": {
        "enum": ["stop", "length", "tool_calls", "content_filter", "cancelled", "error"],
        "description": "Why the reply ended: tool_calls when it called tools; cancelled when the"
        " client cancelled it (the mesh's own reason; the usage billed is reported); error when"
        " the generation failed.",
    },
    "ToolCall": _object(
        {
            "id": STRING,
            "type": {"const": "function"},
            "function": _object(
                {"name": STRING, "arguments": {"type": "string", "description": "JSON text."}}
            ),
        }
    ),
    "ToolCallChunk": {
        "type": "object",
        "description": "A streamed fragment of a tool call: a call's first names its id and function,"
        " later ones of the same index carry more of its arguments.",
        "properties": {
            "index": INT,
            "id": STRING,
            "type": {"const": "function"},
            "function": {"type": "object", "properties": {"name": STRING, "arguments": STRING}},
        },
        "required": ["index", "function"],
    },
    "ChoiceLogprobs": _object(
        {
            "content": {
                "type": "array",
                "items": _object(
                    {
                        "token": STRING,
                        "logprob": {"type": "number"},
                        "bytes": {"type": "array", "items": INT},
                        "top_logprobs": {"type": "array", "items": ref("TopLogprob")},
                    }
                ),
            },
            "refusal": {"type": "null"},
        }
    ),
    "TopLogprob": _object(
        {"token": STRING, "logprob": {"type": "number"}, "bytes": {"type": "array", "items": INT}}
    ),
    "ChatCompletionChunk": {
        "type": "object",
        "description": "The data of one SSE event of a streamed completion.",
        "properties": {
            "id": STRING,
            "object": {"const": "chat.completion.chunk"},
            "created": INT,
            "model": STRING,
            "system_fingerprint": _NULLABLE_STRING,
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": INT,
                        "delta": {
                            "type": "object",
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": STRING,
                                "tool_calls": {"type": "array", "items": ref("ToolCallChunk")},
                            },
                        },
                        "logprobs": {"oneOf": [ref("ChoiceLogprobs"), {"type": "null"}]},
                        "finish_reason": {"oneOf": [ref("FinishReason"), {"type": "null"}]},
                        "content_filter_results": _FILTER_RESULTS,
                    },
                    "required": ["index", "delta", "finish_reason"],
                },
            },
            "usage": {
                "oneOf": [ref("CompletionUsage"), {"type": "null"}],
                "description": "With include_usage: null but on the last chunk; a cancelled"
                " turn's finish chunk carries it too.",
            },
        },
        "required": ["id", "object", "created", "model", "choices"],
    },
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
            "kind": {
                "enum": ["chat", "embedding"],
                "description": "Which endpoints take it: chat turns (chat completions, responses,"
                " completions) or embeddings.",
            },
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
            "lines": {
                "type": "array",
                "description": "The totals by model and purpose: the tenant's turns, or the mesh's "
                "background work for its conversations (summary, memory), which adds tokens, not requests.",
                "items": _object(
                    {
                        "model": STRING,
                        "purpose": {"enum": ["turn", "summary", "memory"]},
                        "input_tokens": INT,
                        "output_tokens": INT,
                        "cost_usd": {"type": "string", "description": "An exact decimal string."},
                        "requests": INT,
                    }
                ),
            },
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
    "Readiness": _object(
        {
            "status": {"enum": ["ok", "unavailable"]},
            # By dependency (redis, global_plane): up, whether readiness needs it, and why not when down.
            "dependencies": {
                "type": "object",
                "additionalProperties": _object(
                    {"up": {"type": "boolean"}, "required": {"type": "boolean"}, "reason": STRING}
                ),
            },
        }
    ),
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
    TextCompletionRequest,
    ResponseRequest,
    CreateConversationRequest,
    ConversationMessageRequest,
    RegenerateRequest,
]
_OBJECTS: list[type[BaseModel]] = [
    ConversationObject,
    DeletedConversationObject,
    MessageObject,
    ListObject[ConversationObject],
    ListObject[MessageObject],
    ListObject[BranchObject],
]


def component_schemas() -> tuple[dict[str, Schema], dict[type[BaseModel], Schema]]:
    """Every component schema by name, and the reference to each pydantic model's."""
    inputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(model, "validation") for model in _MODELS]
    outputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(model, "serialization") for model in _OBJECTS]
    refs, generated = models_json_schema([*inputs, *outputs], ref_template=REF)
    by_model = {model: dict(refs[(model, mode)]) for model, mode in [*inputs, *outputs]}
    return {**generated.get("$defs", {}), **_WRITTEN_OUT}, by_model
