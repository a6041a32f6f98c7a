"""The web pages the edge serves: the chat page (``/chat``) and the operator
page (``/ops``), built from the TypeScript app in the repository's ``web/``
(``npm ci && npm run build``, which ``scripts/setup.sh`` and the Dockerfile
run) into ``edge/web``, and shipped in the package from there.

The pages talk only to this edge's own API (``connect-src 'self'``): the
chat page with the user's API key (kept in the tab's sessionStorage), the
operator page with the edge's operator key (:mod:`edge.ops`). Every answer
carries a Content-Security-Policy that allows no inline script or style and
nothing from another origin, so a message that holds markup stays text.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmmesh.edge.errors import OpenAIError

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
"""What the pages may load and where they may connect: this edge only."""

ASSETS: dict[str, str] = {
    "api.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "ops.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
"""The files under ``/web/``, with their content types; nothing else is served.
The build names its output so (``web/vite.config.ts``)."""

PAGES: dict[str, str] = {"/chat": "chat.html", "/ops": "ops.html"}
"""Each page's path and its file."""

_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    # The key lives in sessionStorage; no page is worth keeping in a shared cache.
    "cache-control": "no-store",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("llmmesh.edge").joinpath("web", name).read_bytes()


def _file(name: str, media_type: str) -> Response:
    try:
        body = _read(name)
    except FileNotFoundError:
        raise OpenAIError(
            503,
            f"the web pages are not built ({name} is missing): run `npm ci && npm run build` in web/"
            " (scripts/setup.sh does)",
            type="server_error",
            code="web_pages_not_built",
        ) from None
    return Response(body, media_type=media_type, headers=_HEADERS)


async def _page(request: Request) -> Response:
    return _file(PAGES[request.url.path], "text/html; charset=utf-8")


async def _asset(request: Request) -> Response:
    name = request.path_params["asset"]
    media_type = ASSETS.get(name)
    if media_type is None:
        raise OpenAIError(404, f"no web asset {name!r}", param="asset", code="not_found")
    return _file(name, media_type)


async def _home(request: Request) -> Response:
    # A person who opens the edge's address finds the chat page, not a JSON 404.
    return RedirectResponse("/chat", status_code=307)


def web_routes() -> list[Route]:
    """The pages, their assets, and ``/``, which leads to the chat page."""
    return [
        Route("/", _home, methods=["GET"]),
        *(Route(path, _page, methods=["GET"]) for path in PAGES),
        Route("/web/{asset}", _asset, methods=["GET"]),
    ]
