"""Errors at the edge, in OpenAI's convention:
``{"error": {"message", "type", "param", "code"}}`` with a matching status.

Mesh errors are mapped here once, from their gRPC code and ErrorInfo reason.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import grpc
from starlette.responses import JSONResponse

from llmmesh.core.errors import MeshError, Reason
from llmmesh.edge.ratelimit_headers import refusal_ratelimit_headers
from llmmesh.edge.traffic_series import TRAFFIC


class OpenAIError(Exception):
    """An error answered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        ratelimit: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        # The x-ratelimit-* headers of a rate-limit refusal.
        self.ratelimit: dict[str, str] = dict(ratelimit or {})

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """``retry-after`` (whole seconds, at least 1) when a retry helps, with
        ``retry-after-ms``: the same wait plus up to a quarter more, at
        random, which the OpenAI SDKs read first, so clients refused
        together do not come back together. And the ``x-ratelimit-*``
        headers of a rate-limit refusal."""
        headers = dict(self.ratelimit)
        if self.retry_after_s is not None:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
            wait_ms = max(1.0, self.retry_after_s * 1000)
            headers["retry-after-ms"] = str(round(wait_ms * (1 + _JITTER.uniform(0, RETRY_JITTER))))
        return headers

    def response(self, extra_headers: dict[str, str] | None = None) -> JSONResponse:
        """The error as the HTTP answer; counted for the operator page (:mod:`edge.traffic_series`)."""
        TRAFFIC.error_answered(self.code or self.type)
        return JSONResponse(
            self.body(), status_code=self.status, headers={**self.headers(), **(extra_headers or {})}
        )


RETRY_JITTER = 0.25
"""The most ``retry-after-ms`` adds to a refusal's wait, as a share of it."""
_JITTER = random.Random()

_STATUS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNIMPLEMENTED: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_request_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error"),
    grpc.StatusCode.ABORTED: (409, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.CANCELLED: (400, "invalid_request_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (503, "server_error"),
    grpc.StatusCode.INTERNAL: (500, "server_error"),
    grpc.StatusCode.UNKNOWN: (500, "server_error"),
    grpc.StatusCode.DATA_LOSS: (500, "server_error"),
}

# OpenAI's own codes where one exists; otherwise the reason in lower case.
_CODE: dict[str, str] = {
    Reason.API_KEY_MISSING: "missing_api_key",
    Reason.API_KEY_INVALID: "invalid_api_key",
    Reason.API_KEY_REVOKED: "invalid_api_key",
    Reason.API_KEY_EXPIRED: "invalid_api_key",
    Reason.UNKNOWN_MODEL: "model_not_found",
    Reason.RATE_LIMITED: "rate_limit_exceeded",
    Reason.QUOTA_EXCEEDED: "insufficient_quota",
    Reason.PROMPT_TOO_LONG: "context_length_exceeded",
    Reason.CONTENT_FILTERED: "content_policy_violation",
}

# Reasons whose status differs from their gRPC code's.
_STATUS_BY_REASON: dict[str, tuple[int, str]] = {
    # Residency: a zone with no serving region refuses rather than spilling over.
    Reason.NO_REGION_IN_ZONE: (403, "permission_error"),
    Reason.QUOTA_EXCEEDED: (429, "insufficient_quota"),
    # OpenAI answers a flagged prompt with 400, not 403.
    Reason.CONTENT_FILTERED: (400, "invalid_request_error"),
}


def _transport_limit(err: MeshError) -> bool:
    """Whether ``err`` is gRPC's own refusal of an oversized message or
    metadata rather than a plane's: it has no ErrorInfo (so the default
    OVERLOADED reason) and no RetryInfo, which every overload the mesh
    declares carries. Retrying it cannot help, so it must not be a 429."""
    return (
        err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and err.reason == Reason.OVERLOADED
        and err.retry_after_s is None
    )


def from_mesh_error(err: MeshError) -> OpenAIError:
    """The OpenAI error that a mesh error becomes at the edge."""
    if _transport_limit(err):
        # gRPC's message names its internal limits; the client needs none of it.
        return OpenAIError(400, "the request is larger than the mesh accepts", code="request_too_large")
    status, kind = _STATUS_BY_REASON.get(err.reason) or _STATUS.get(err.code, (500, "server_error"))
    retry = (
        err.retry_after_s
        if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
        else None
    )
    return OpenAIError(
        status,
        err.message or err.reason,
        type=kind,
        param=err.metadata.get("param"),
        code=_CODE.get(err.reason, err.reason.lower()),
        retry_after_s=retry,
        # Only the key's own rate limits have figures to report; quota and overload do not.
        ratelimit=refusal_ratelimit_headers(err.metadata) if err.reason == Reason.RATE_LIMITED else None,
    )
