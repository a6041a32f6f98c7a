"""Headers every edge answer carries, whatever its route: browsers must
not guess a content type (``nosniff``), no page of the edge may be framed by
another site, and none sends a referrer. An answer with no
Content-Security-Policy of its own (the API's JSON, ``/openapi.json``, errors)
gets one that lets it load nothing; the web pages and ``/docs`` set their own.

It adds them at the answer's start (:mod:`edge.response_start`), so
streams pass through as they are.
"""

from __future__ import annotations

from starlette.types import Scope

from llmmesh.edge.response_start import Headers, ResponseStartMiddleware

NOTHING_LOADS = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
"""The policy of an answer that is not a page: it may load and embed nothing."""

_DEFAULTS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", NOTHING_LOADS.encode()),
)


class SecurityHeadersMiddleware(ResponseStartMiddleware):
    """Adds each of the edge's security headers that an answer does not set itself."""

    def on_start(self, scope: Scope, status: int, headers: Headers) -> None:
        present = {name.lower() for name, _ in headers}
        headers.extend((name, value) for name, value in _DEFAULTS if name not in present)
