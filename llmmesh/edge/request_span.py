"""A server span for every API request the edge answers, covering the
whole answer (an SSE stream until its last event), the root of the turn's
trace: or the child of the client's own span when the request carries a
W3C ``traceparent`` header.

Pure ASGI middleware that never wraps the body, so streams and client
disconnects pass through as they are. With tracing off it only passes the
request on. Health, readiness and metrics scrapes are not traced.
"""

from __future__ import annotations

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmmesh.core import tracing

_UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})
_REQUEST_ID = b"x-request-id"


def _trace_headers(scope: Scope) -> dict[str, str]:
    wanted = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
    return {wanted[name]: value.decode("latin-1") for name, value in scope["headers"] if name in wanted}


class RequestSpanMiddleware:
    """Wraps each traced HTTP request in a server span (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.enabled() or scope["path"] in _UNTRACED:
            await self._app(scope, receive, send)
            return
        method = scope["method"]
        attributes = {"http.request.method": method, "url.path": scope["path"], "llmmesh.plane": "edge"}
        with tracing.span(
            f"{method} {scope['path']}",
            kind=SpanKind.SERVER,
            parent=tracing.extract_headers(_trace_headers(scope)),
            attributes=attributes,
        ) as span:

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
                    for name, value in message.get("headers", []):
                        if name.lower() == _REQUEST_ID:
                            span.set_attribute("llmmesh.request_id", value.decode("latin-1"))
                await send(message)

            await self._app(scope, receive, traced_send)
