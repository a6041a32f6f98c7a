"""Mesh errors map once to OpenAI's error object and status."""

from __future__ import annotations

import pytest

from llmmesh.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    MeshError,
    NotFound,
    Reason,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from llmmesh.edge.errors import RETRY_JITTER, OpenAIError, from_mesh_error


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (
            InvalidArgument(Reason.INVALID_SAMPLING, "bad", metadata={"param": "top_p"}),
            400,
            "invalid_sampling",
        ),
        (Unauthenticated(Reason.API_KEY_INVALID, "bad key"), 401, "invalid_api_key"),
        (NotFound(Reason.UNKNOWN_MODEL, "no model"), 404, "model_not_found"),
        (ResourceExhausted(Reason.RATE_LIMITED, "slow down", retry_after_s=2.5), 429, "rate_limit_exceeded"),
        (ResourceExhausted(Reason.QUOTA_EXCEEDED, "quota"), 429, "insufficient_quota"),
        (FailedPrecondition(Reason.NO_REGION_IN_ZONE, "none in eu"), 403, "no_region_in_zone"),
        (Unavailable(Reason.REGION_UNAVAILABLE, "down", retry_after_s=1), 503, "region_unavailable"),
        (InvalidArgument(Reason.PROMPT_TOO_LONG, "long"), 400, "context_length_exceeded"),
    ],
)
def test_mapping(error: MeshError, status: int, code: str) -> None:
    mapped = from_mesh_error(error)
    assert (mapped.status, mapped.code) == (status, code)
    body = mapped.body()["error"]
    assert isinstance(body, dict)
    assert body["message"] == error.message
    assert body["param"] == error.metadata.get("param")


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    mapped = from_mesh_error(ResourceExhausted(Reason.RATE_LIMITED, "slow", retry_after_s=2.1))
    assert mapped.headers()["retry-after"] == "3"
    assert OpenAIError(400, "x").headers() == {}


def test_retry_after_ms_spreads_clients_refused_together_over_a_quarter_more() -> None:
    mapped = from_mesh_error(ResourceExhausted(Reason.OVERLOADED, "busy", retry_after_s=2.0))
    waits = [int(mapped.headers()["retry-after-ms"]) for _ in range(200)]
    assert all(2000 <= wait <= 2000 * (1 + RETRY_JITTER) for wait in waits)
    # Spread, not one value: at least a third of the range is used.
    assert max(waits) - min(waits) >= 2000 * RETRY_JITTER / 3


def test_only_a_declared_overload_is_a_429() -> None:
    # The mesh's overloads carry RetryInfo; gRPC's own RESOURCE_EXHAUSTED (an
    # oversized message or metadata) has neither ErrorInfo nor RetryInfo.
    declared = from_mesh_error(ResourceExhausted(Reason.OVERLOADED, "busy", retry_after_s=0.5))
    assert (declared.status, declared.code) == (429, "overloaded")
    transport = from_mesh_error(ResourceExhausted(Reason.OVERLOADED, "received metadata size exceeds limit"))
    assert (transport.status, transport.type, transport.code) == (
        400,
        "invalid_request_error",
        "request_too_large",
    )
    assert "metadata" not in transport.message
