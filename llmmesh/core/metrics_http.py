"""A plane's ``/metrics`` endpoint: a Prometheus registry over HTTP, on a
thread of its own so a busy event loop never delays a scrape.

It always answers in the Prometheus text format (0.0.4), never OpenMetrics:
prometheus_client's OpenMetrics writer turns the colons of vLLM's names
(``vllm:num_requests_waiting``) into underscores in the samples while its
``# TYPE`` lines keep them, so a Prometheus that asks for OpenMetrics (every
2.x server does) would store the series under other names than vLLM's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

_PATHS = ("/", "/metrics")
# socketserver's default is 0.5 s: a plane's stop would hold its event loop that long per endpoint.
_STOP_POLL_S = 0.05


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape; they never hold the process up at exit."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def metrics_app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering ``GET /metrics`` (or ``/``) with ``registry`` in the text format."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in _PATHS:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: the metrics are at /metrics\n"]
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        body = generate_latest(registry)
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))]
        )
        return [body]

    return app


class MetricsEndpoint:
    """Serves ``registry`` on ``host:port`` (0 picks a free port) until :meth:`stop`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server = make_server(
            host, port, metrics_app(registry), server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            # How long stop() may wait for the serving loop to notice (it blocks its caller's event loop).
            kwargs={"poll_interval": _STOP_POLL_S},
            name="metrics-http",
            daemon=True,
        )
        self._thread.start()
        self.address = f"{host}:{self._server.server_port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
