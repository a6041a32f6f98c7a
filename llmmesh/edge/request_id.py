"""Every edge answer carries ``x-request-id``, as OpenAI's API does.

A route that has an id of its own sets the header itself (a chat completion's
is its completion id, also its stream id) and keeps it. Any other answer,
errors included, gets the id the client sent in ``x-request-id`` when that is
a plain token, so a client can match answers to its own ids, and a fresh
``req_…`` id otherwise.

This is pure ASGI middleware meant to wrap the whole application, outside
Starlette's own error middleware, so that even an unexpected 500 carries the
header; it never wraps the response body, so streams pass through as they are.
"""

from __future__ import annotations

import re

from starlette.types import Scope

from llmmesh.core.ids import new_id
from llmmesh.edge.response_start import Headers, ResponseStartMiddleware

HEADER = "x-request-id"
_HEADER_BYTES = HEADER.encode()
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""What a client's own request id may be: short, and safe to log and echo."""


def answer_request_id(sent: str | None) -> str:
    """The id to answer with: ``sent`` (the client's header) when it is at
    most 128 characters of letters, digits and ``._:-``; a fresh one (``req_`` and 24
    hex digits) otherwise."""
    if sent is not None and _TOKEN.fullmatch(sent):
        return sent
    return new_id("req")


def _sent_request_id(scope: Scope) -> str | None:
    """The request's first ``x-request-id`` header, if any."""
    for name, value in scope["headers"]:
        if name.lower() == _HEADER_BYTES:
            text: str = value.decode("latin-1")
            return text
    return None


class RequestIdMiddleware(ResponseStartMiddleware):
    """Adds ``x-request-id`` to every HTTP answer that has none."""

    def on_start(self, scope: Scope, status: int, headers: Headers) -> None:
        if not any(name.lower() == _HEADER_BYTES for name, _ in headers):
            chosen = answer_request_id(_sent_request_id(scope))
            headers.append((_HEADER_BYTES, chosen.encode("latin-1")))
