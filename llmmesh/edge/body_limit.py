"""A bound on every request body, counted as its bytes arrive.

The routes check a declared ``Content-Length`` before reading, but a
chunked body declares none: without a bound here, ``request.body()`` or a
multipart form would take in whatever a client sends before any size check
ran. This middleware counts the bytes each ``http.request`` message carries
and, past ``limit``, fails the read with the same 400 ``request_too_large``
the routes answer for a declared size, so the route's handler never sees
the rest of the body.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmmesh.edge.errors import OpenAIError


def too_large(limit: int) -> OpenAIError:
    """The refusal of a body over ``limit`` bytes."""
    return OpenAIError(400, f"request body larger than {limit} bytes", code="request_too_large")


class BodyLimitMiddleware:
    """Pure ASGI middleware: a body read past ``limit`` bytes raises :func:`too_large`
    (inside the route, so the app's OpenAI error handler answers it)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self._app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._limit:
                    raise too_large(self._limit)
            return message

        await self._app(scope, bounded_receive, send)
