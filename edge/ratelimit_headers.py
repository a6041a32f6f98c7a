"""OpenAI's ``x-ratelimit-*`` response headers, from the figures the region's
admission reports in ``ChatStarted.rate_limit``.

A limit of 0 is unlimited: its trio of headers is left out, as OpenAI sends
none for a limit that does not apply.
"""

from __future__ import annotations

from google.protobuf import duration_pb2

from llmmesh.v1 import chat_service_pb2


def ratelimit_headers(started: chat_service_pb2.ChatStarted) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for a turn the region accepted."""
    status = started.rate_limit
    headers: dict[str, str] = {}
    for kind, limit, remaining, reset in (
        ("requests", status.limit_requests, status.remaining_requests, status.reset_requests),
        ("tokens", status.limit_tokens, status.remaining_tokens, status.reset_tokens),
    ):
        if limit > 0:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, remaining))
            headers[f"x-ratelimit-reset-{kind}"] = reset_text(_seconds(reset))
    return headers


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes its resets (Go's notation): ``"20ms"``,
    ``"1s"``, ``"2.5s"``, ``"6m0s"``, ``"1h0m0s"``; never below ``"0s"``."""
    millis = max(0, round(seconds * 1000))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _seconds(span: duration_pb2.Duration) -> float:
    return span.seconds + span.nanos / 1e9
