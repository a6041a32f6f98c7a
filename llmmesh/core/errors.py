"""The mesh's error model (AIP-193): a canonical gRPC code, one ErrorInfo with
a fixed domain and an UPPER_SNAKE reason, and RetryInfo where a retry helps.

Every plane raises :class:`MeshError` subclasses from its plain classes;
servicers turn them into a rich gRPC status once (:meth:`MeshError.abort`),
clients turn a failed call back into one (:func:`from_rpc_error`), and the
edge maps them once more to OpenAI's error object.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NoReturn

import grpc
import grpc.aio
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from llmmesh.v1 import common_pb2

DOMAIN = "llmmesh.dev"


class Reason(StrEnum):
    """ErrorInfo reasons used across the mesh."""

    INVALID_REQUEST = "INVALID_REQUEST"
    EMPTY_PROMPT = "EMPTY_PROMPT"
    PROMPT_TOO_LONG = "PROMPT_TOO_LONG"
    INVALID_SAMPLING = "INVALID_SAMPLING"
    UNKNOWN_MODEL = "UNKNOWN_MODEL"
    MODEL_NOT_ALLOWED = "MODEL_NOT_ALLOWED"
    MODEL_RETIRED = "MODEL_RETIRED"
    MODEL_WRONG_KIND = "MODEL_WRONG_KIND"
    API_KEY_MISSING = "API_KEY_MISSING"
    API_KEY_INVALID = "API_KEY_INVALID"
    API_KEY_REVOKED = "API_KEY_REVOKED"
    API_KEY_EXPIRED = "API_KEY_EXPIRED"
    TENANT_NOT_FOUND = "TENANT_NOT_FOUND"
    TENANT_EXISTS = "TENANT_EXISTS"
    TENANT_DELETED = "TENANT_DELETED"
    KEY_NOT_FOUND = "KEY_NOT_FOUND"
    END_USER_NOT_PSEUDONYMOUS = "END_USER_NOT_PSEUDONYMOUS"
    REQUEST_NOT_FOUND = "REQUEST_NOT_FOUND"
    DUPLICATE_REQUEST = "DUPLICATE_REQUEST"
    CONVERSATION_NOT_FOUND = "CONVERSATION_NOT_FOUND"
    MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"
    WRONG_ZONE = "WRONG_ZONE"
    NO_REGION_IN_ZONE = "NO_REGION_IN_ZONE"
    ZONE_UNKNOWN = "ZONE_UNKNOWN"
    REGION_NOT_FOUND = "REGION_NOT_FOUND"
    RATE_LIMITED = "RATE_LIMITED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    OVERLOADED = "OVERLOADED"
    CONTENT_FILTERED = "CONTENT_FILTERED"
    SAFETY_UNAVAILABLE = "SAFETY_UNAVAILABLE"
    ENGINE_UNAVAILABLE = "ENGINE_UNAVAILABLE"
    REGION_UNAVAILABLE = "REGION_UNAVAILABLE"
    GLOBAL_PLANE_UNAVAILABLE = "GLOBAL_PLANE_UNAVAILABLE"
    ENGINE_FAILED = "ENGINE_FAILED"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    PEER_UNAUTHENTICATED = "PEER_UNAUTHENTICATED"
    PEER_NOT_ALLOWED = "PEER_NOT_ALLOWED"
    ADMIN_REQUIRED = "ADMIN_REQUIRED"
    INTERNAL = "INTERNAL"


class MeshError(Exception):
    """An error that crosses a plane boundary.

    Subclasses fix the gRPC code; ``reason`` names the case, ``metadata``
    carries ErrorInfo metadata (``param`` names the offending field), and
    ``retry_after_s`` becomes RetryInfo.
    """

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        reason: Reason | str,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = str(reason)
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason}: {self.message})"

    def to_status_proto(self) -> status_pb2.Status:
        """The google.rpc.Status with ErrorInfo (and RetryInfo) details."""
        details: list[any_pb2.Any] = []
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.metadata))
        details.append(info)
        if self.retry_after_s is not None:
            retry = any_pb2.Any()
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(int(self.retry_after_s * 1000))
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(retry)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=details)

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        """End the RPC with this error as a rich status."""
        status = rpc_status.to_status(self.to_status_proto())
        await context.abort(status.code, status.details, status.trailing_metadata)
        raise AssertionError("context.abort returned")  # pragma: no cover

    def to_stream_error(self) -> common_pb2.StreamError:
        """This error as an in-stream event."""
        return common_pb2.StreamError(
            code=self.code.value[0],
            message=self.message,
            reason=self.reason,
            domain=DOMAIN,
            metadata=self.metadata,
            retry_delay_ms=int((self.retry_after_s or 0) * 1000),
        )


class InvalidArgument(MeshError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(MeshError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(MeshError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MeshError):
    code = grpc.StatusCode.ALREADY_EXISTS


class Unauthenticated(MeshError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(MeshError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(MeshError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(MeshError):
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(MeshError):
    code = grpc.StatusCode.CANCELLED


class DeadlineExceeded(MeshError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(MeshError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(MeshError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[int, type[MeshError]] = {
    cls.code.value[0]: cls
    for cls in (
        InvalidArgument,
        FailedPrecondition,
        NotFound,
        AlreadyExists,
        Unauthenticated,
        PermissionDenied,
        ResourceExhausted,
        Unavailable,
        Cancelled,
        DeadlineExceeded,
        Unimplemented,
        Internal,
    )
}
_DEFAULT_REASON: dict[int, Reason] = {
    code_pb2.UNAVAILABLE: Reason.REGION_UNAVAILABLE,
    code_pb2.RESOURCE_EXHAUSTED: Reason.OVERLOADED,
    code_pb2.INVALID_ARGUMENT: Reason.INVALID_REQUEST,
}


def error_for_code(
    code: int,
    reason: str,
    message: str,
    metadata: Mapping[str, str] | None = None,
    retry_after_s: float | None = None,
) -> MeshError:
    """Build the MeshError subclass that matches a canonical code."""
    cls = _BY_CODE.get(code, Internal)
    return cls(
        reason or _DEFAULT_REASON.get(code, Reason.INTERNAL),
        message,
        metadata=metadata,
        retry_after_s=retry_after_s,
    )


def from_rpc_error(err: grpc.aio.AioRpcError) -> MeshError:
    """Rebuild the MeshError a peer raised from its failed call."""
    code = err.code().value[0]
    reason = ""
    metadata: dict[str, str] = {}
    retry_after: float | None = None
    status = rpc_status.from_call(err)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
                metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.ToMilliseconds() / 1000
    if code == code_pb2.UNAVAILABLE and retry_after is None:
        retry_after = 1.0
    return error_for_code(code, reason, err.details() or "", metadata, retry_after)


def from_stream_error(event: common_pb2.StreamError) -> MeshError:
    """Rebuild the MeshError an in-stream error event carries."""
    retry = event.retry_delay_ms / 1000 if event.retry_delay_ms else None
    return error_for_code(event.code, event.reason, event.message, dict(event.metadata), retry)
