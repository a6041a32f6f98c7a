"""What the edge's one-shot JSON endpoints (``/v1/embeddings``,
``/v1/moderations``) share: the body read as a JSON object of known fields,
400s in OpenAI's shape, and the headers of an answer a zone's region gave.

Each endpoint checks its own fields; this module only refuses a body that
is not an object, or that holds a field the endpoint does not know (OpenAI
answers such a field with ``unknown_parameter``, and so does the edge,
rather than ignore it).
"""

from __future__ import annotations

from collections.abc import Set

from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.ratelimit_headers import ratelimit_headers
from llmmesh.v1 import chat_service_pb2


def bad_request(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    """A 400 naming the offending field ``param``."""
    return OpenAIError(400, message, param=param, code=code)


def object_of_fields(body: object, fields: Set[str]) -> dict[str, object]:
    """``body`` as a JSON object whose keys are all among ``fields``, or a 400
    (``invalid_type`` for a body that is not an object, ``unknown_parameter``
    naming the first field the endpoint does not know)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", "", "invalid_type")
    for key in body:
        if key not in fields:
            raise bad_request(f"Unrecognized request argument supplied: {key}", str(key), "unknown_parameter")
    return body


def answer_headers(
    request_id: str, region: str, rate_limit: chat_service_pb2.RateLimitStatus
) -> dict[str, str]:
    """``x-request-id``, ``x-llmmesh-region`` and the ``x-ratelimit-*``
    headers for an answer ``region`` gave under ``request_id``."""
    headers = {"x-request-id": request_id, "x-llmmesh-region": region}
    headers.update(ratelimit_headers(chat_service_pb2.ChatStarted(rate_limit=rate_limit)))
    return headers
