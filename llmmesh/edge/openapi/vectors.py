"""The OpenAPI description of ``POST /v1/embeddings`` and ``POST
/v1/moderations`` (:mod:`edge.embeddings`, :mod:`edge.moderations`): their
request bodies and answers, merged into the edge's document by
:mod:`edge.openapi.document`."""

from __future__ import annotations

from llmmesh.edge.openapi.components import INT, STRING, Schema, ref

_TOKENS: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}

SCHEMAS: dict[str, Schema] = {
    "EmbeddingsRequest": {
        "type": "object",
        "properties": {
            "model": {**STRING, "description": "An embedding model, as GET /v1/models lists it."},
            "input": {
                "description": "A string, strings, token ids, or token-id arrays; at most 2048 items.",
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                    _TOKENS,
                    {"type": "array", "items": _TOKENS, "minItems": 1},
                ],
            },
            "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {
                "type": "integer",
                "minimum": 1,
                "description": "Keep this many leading components.",
            },
            "user": STRING,
        },
        "required": ["model", "input"],
        "additionalProperties": False,
    },
    "EmbeddingList": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": INT,
                        "embedding": {
                            "oneOf": [{"type": "array", "items": {"type": "number"}}, STRING],
                            "description": "Floats, or base64 of little-endian float32.",
                        },
                    },
                    "required": ["object", "index", "embedding"],
                },
            },
            "model": STRING,
            "usage": {
                "type": "object",
                "properties": {"prompt_tokens": INT, "total_tokens": INT},
                "required": ["prompt_tokens", "total_tokens"],
            },
        },
        "required": ["object", "data", "model", "usage"],
    },
    "ModerationRequest": {
        "type": "object",
        "properties": {
            "model": {**STRING, "description": "Absent, or the region's model (llmmesh-moderation)."},
            "input": {
                "description": "A string, strings, or text parts (image parts are refused).",
                "oneOf": [
                    STRING,
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "oneOf": [
                                STRING,
                                {
                                    "type": "object",
                                    "properties": {"type": {"const": "text"}, "text": STRING},
                                    "required": ["type", "text"],
                                },
                            ]
                        },
                    },
                ],
            },
        },
        "required": ["input"],
        "additionalProperties": False,
    },
    "Moderation": {
        "type": "object",
        "properties": {
            "id": STRING,
            "model": STRING,
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "flagged": {"type": "boolean"},
                        "categories": {"type": "object", "additionalProperties": {"type": "boolean"}},
                        "category_scores": {"type": "object", "additionalProperties": {"type": "number"}},
                        "category_applied_input_types": {
                            "type": "object",
                            "additionalProperties": {"type": "array", "items": STRING},
                        },
                    },
                    "required": ["flagged", "categories", "category_scores"],
                },
            },
        },
        "required": ["id", "model", "results"],
    },
}

EXAMPLES: dict[str, Schema] = {
    "EmbeddingsRequest": {"model": "llmmesh-tiny-embed", "input": ["a mesh of regions"]},
    "ModerationRequest": {"input": "I want to hurt them."},
}
"""A valid body of each request."""


def body(name: str) -> tuple[Schema, Schema]:
    """The request body schema ``name`` and its example, for an operation."""
    return ref(name), EXAMPLES[name]
