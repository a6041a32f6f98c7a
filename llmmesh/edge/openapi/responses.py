"""The OpenAPI description of the Responses API (:mod:`edge.responses`):
its operations and the objects they answer, merged into the edge's document
by :mod:`edge.openapi.document` (the request body is the pydantic model's
schema)."""

from __future__ import annotations

from collections.abc import Mapping

from llmmesh.edge.openapi.components import INT, STRING, Schema, ref

_ITEM: Schema = {
    "type": "object",
    "description": "An output item: an assistant `message` with one `output_text` part, or a"
    " `function_call` (`call_id`, `name`, `arguments`).",
    "properties": {
        "id": STRING,
        "type": {"enum": ["message", "function_call", "function_call_output"]},
        "status": {"enum": ["in_progress", "completed", "incomplete"]},
    },
    "required": ["id", "type"],
}

SCHEMAS: dict[str, Schema] = {
    "Response": {
        "type": "object",
        "description": "A response, with the request's parameters echoed when it is created.",
        "properties": {
            "id": {**STRING, "description": 'The response id, "resp_...".'},
            "object": {"const": "response"},
            "created_at": INT,
            "status": {"enum": ["completed", "incomplete", "in_progress", "cancelled", "failed"]},
            "model": STRING,
            "output": {"type": "array", "items": _ITEM},
            "usage": {"type": ["object", "null"]},
            "error": {"type": ["object", "null"]},
            "incomplete_details": {"type": ["object", "null"]},
        },
        "required": ["id", "object", "created_at", "status", "model", "output"],
    },
    "ResponseDeleted": {
        "type": "object",
        "properties": {"id": STRING, "object": {"const": "response"}, "deleted": {"const": True}},
        "required": ["id", "object", "deleted"],
    },
    "ResponseInputItems": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ITEM},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        "required": ["object", "data", "first_id", "last_id", "has_more"],
    },
}

_SSE: Schema = {
    "description": "Typed events (`event:` and `data:` lines, each with its `sequence_number`):"
    " response.created ... response.completed (or response.incomplete, or response.failed and error).",
    "schema": {
        "type": "object",
        "properties": {"data": STRING, "id": STRING, "event": STRING},
        "required": ["event", "data"],
    },
}

_RESPONSE_ID: Schema = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "description": "The id of a stored response.",
    "schema": STRING,
}

EXAMPLE: Schema = {"model": "auto", "input": "Hello!", "max_output_tokens": 64}


def paths(request: Schema, errors: Mapping[str, Schema]) -> dict[str, Schema]:
    """The operations, ``request`` the create body's schema, answering ``errors`` besides their 200."""

    def ok(description: str, schema: str) -> Schema:
        return {"description": description, "content": {"application/json": {"schema": ref(schema)}}}

    page = [
        {
            "name": "order",
            "in": "query",
            "schema": {"enum": ["asc", "desc"]},
            "description": "desc by default.",
        },
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "after", "in": "query", "schema": STRING, "description": "An item id of an earlier page."},
    ]
    return {
        "/v1/responses": {
            "post": {
                "summary": "Create a response: a chat turn, kept in the tenant's zone unless store is false.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request, "example": EXAMPLE}},
                },
                "responses": {
                    "200": {
                        "description": "One `Response`, or typed SSE events when `stream` is true.",
                        "content": {
                            "application/json": {"schema": ref("Response")},
                            "text/event-stream": _SSE,
                        },
                    },
                    **errors,
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response.",
                "parameters": [_RESPONSE_ID],
                "responses": {"200": ok("The response.", "Response"), **errors},
            },
            "delete": {
                "summary": "Delete a stored response with its thread.",
                "parameters": [_RESPONSE_ID],
                "responses": {"200": ok("Deleted.", "ResponseDeleted"), **errors},
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "summary": "The stored input items of a response.",
                "parameters": [_RESPONSE_ID, *page],
                "responses": {"200": ok("A page.", "ResponseInputItems"), **errors},
            }
        },
    }
