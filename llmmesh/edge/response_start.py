"""Pure ASGI middleware that sees the start of every HTTP answer (its status
and headers) and may add headers to it. It never wraps the body, so streams
and client disconnects pass through as they are."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


class ResponseStartMiddleware:
    """Calls :meth:`on_start` with each HTTP answer's status and headers
    (a list it may add to) before the answer goes out."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    def on_start(self, scope: Scope, status: int, headers: Headers) -> None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_seen(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                self.on_start(scope, message["status"], headers)
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, send_seen)
