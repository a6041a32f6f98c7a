"""OpenAI's ``x-ratelimit-*`` response headers, from the figures the region's
admission reports: in ``ChatStarted.rate_limit`` for a turn it accepted, and
as ErrorInfo metadata on a RATE_LIMITED refusal (the 429).

A limit of 0 is unlimited: its trio of headers is left out, as OpenAI sends
none for a limit that does not apply.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf import duration_pb2

from llmmesh.v1 import chat_service_pb2


def ratelimit_headers(started: chat_service_pb2.ChatStarted) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for a turn the region accepted."""
    status = started.rate_limit
    requests = _trio(
        "requests", status.limit_requests, status.remaining_requests, _seconds(status.reset_requests)
    )
    tokens = _trio("tokens", status.limit_tokens, status.remaining_tokens, _seconds(status.reset_tokens))
    return {**requests, **tokens}


def refusal_ratelimit_headers(metadata: Mapping[str, str]) -> dict[str, str]:
    """The same headers for a turn the region refused for its rate limits,
    from the refusal's ErrorInfo metadata (``limit_requests``,
    ``remaining_requests``, ``reset_requests_ms`` and their ``tokens``
    twins). A limit whose figures are missing or not whole numbers (a
    refusal that carries none) gets no headers."""
    headers: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        names = (f"limit_{kind}", f"remaining_{kind}", f"reset_{kind}_ms")
        figures = [metadata.get(name, "") for name in names]
        if all(text.isdecimal() for text in figures):
            limit, remaining, reset_ms = (int(text) for text in figures)
            headers.update(_trio(kind, limit, remaining, reset_ms / 1000))
    return headers


def _trio(kind: str, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    """One limit's three headers; none for an unlimited one."""
    if limit <= 0:
        return {}
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, remaining)),
        f"x-ratelimit-reset-{kind}": reset_text(reset_s),
    }


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
