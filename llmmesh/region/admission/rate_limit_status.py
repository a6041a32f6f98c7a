"""The key's limits as a request's admission left them, on the wire: what
the edge turns into ``x-ratelimit-*`` headers."""

from __future__ import annotations

from google.protobuf import duration_pb2

from llmmesh.region.admission.ratelimit import Reservation
from llmmesh.v1 import chat_service_pb2


def rate_limit_status(reservation: Reservation) -> chat_service_pb2.RateLimitStatus:
    """The key's limits as a turn's admission left them, for the edge's ``x-ratelimit-*`` headers."""
    return chat_service_pb2.RateLimitStatus(
        limit_requests=reservation.limit_requests,
        remaining_requests=reservation.remaining_requests,
        reset_requests=_duration(reservation.reset_requests_s),
        limit_tokens=reservation.limit_tokens,
        remaining_tokens=reservation.remaining_tokens,
        reset_tokens=_duration(reservation.reset_tokens_s),
    )


def _duration(seconds: float) -> duration_pb2.Duration:
    span = duration_pb2.Duration()
    span.FromNanoseconds(round(seconds * 1e9))
    return span
