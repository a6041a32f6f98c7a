"""The OpenAPI description of ``POST /v1/completions`` (:mod:`edge.text_completions`):
its answers, merged into the edge's document by :mod:`edge.openapi.document`
(the request body is the pydantic model's schema)."""

from __future__ import annotations

from llmmesh.edge.openapi.components import INT, STRING, Schema, ref

_NULLABLE_STRING: Schema = {"type": ["string", "null"]}

_LOGPROBS: Schema = {
    "description": "With logprobs: the legacy shape, offsets in characters of the choice's text.",
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "tokens": {"type": "array", "items": STRING},
                "token_logprobs": {"type": "array", "items": {"type": "number"}},
                "top_logprobs": {
                    "type": "array",
                    "items": {"type": "object", "additionalProperties": {"type": "number"}},
                },
                "text_offset": {"type": "array", "items": INT},
            },
            "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
        },
        {"type": "null"},
    ],
}


def _choice(finish: Schema) -> Schema:
    return {
        "type": "object",
        "properties": {"text": STRING, "index": INT, "logprobs": _LOGPROBS, "finish_reason": finish},
        "required": ["text", "index", "logprobs", "finish_reason"],
    }


def _completion(object_name: str, usage: Schema, description: str) -> Schema:
    finish: Schema = {"oneOf": [ref("FinishReason"), {"type": "null"}]}
    return {
        "type": "object",
        "description": description,
        "properties": {
            "id": {**STRING, "description": 'The completion id, "cmpl-...".'},
            "object": {"const": object_name},
            "created": INT,
            "model": STRING,
            "system_fingerprint": _NULLABLE_STRING,
            "choices": {"type": "array", "items": _choice(finish)},
            "usage": usage,
        },
        "required": ["id", "object", "created", "model", "choices"],
    }


SCHEMAS: dict[str, Schema] = {
    "TextCompletion": _completion(
        "text_completion", ref("CompletionUsage"), "A whole text completion: a choice per prompt."
    ),
    "TextCompletionChunk": _completion(
        "text_completion",
        {"oneOf": [ref("CompletionUsage"), {"type": "null"}]},
        "The data of one SSE event of a streamed text completion.",
    ),
}

SSE: Schema = {
    "description": "`text_completion` events (components/schemas/TextCompletionChunk), ending in"
    " `data: [DONE]`; each with an `id:` line only for a client that opts into event ids.",
    "schema": {
        "type": "object",
        "properties": {"data": STRING, "id": STRING, "event": STRING, "retry": INT},
        "required": ["data"],
    },
}

EXAMPLE: Schema = {"model": "auto", "prompt": "Once upon a time", "max_tokens": 16}
