"""The edge's HTTP application: OpenAI-compatible routes, health and metrics.
Every error leaves as an OpenAI error object."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from llmmesh.core.errors import MeshError
from llmmesh.core.usage_purpose import purpose_name
from llmmesh.edge import metrics
from llmmesh.edge.body_limit import BodyLimitMiddleware
from llmmesh.edge.caller import authenticate
from llmmesh.edge.completions import CompletionsHandler
from llmmesh.edge.conversations import ConversationsHandler
from llmmesh.edge.embeddings import EmbeddingsHandler
from llmmesh.edge.errors import OpenAIError, from_mesh_error
from llmmesh.edge.file_batches import FileBatchRoutes
from llmmesh.edge.files import FileRoutes
from llmmesh.edge.health import path_health
from llmmesh.edge.memories import MemoryRoutes
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.model_routes import ModelRoutes
from llmmesh.edge.moderations import ModerationsHandler
from llmmesh.edge.openapi.docs_page import DOCS_POLICY, docs_page
from llmmesh.edge.openapi.document import openapi_document
from llmmesh.edge.ops import PERIOD, OpsRoutes
from llmmesh.edge.readiness import edge_readiness
from llmmesh.edge.request_span import RequestSpanMiddleware
from llmmesh.edge.response_start import Headers, ResponseStartMiddleware
from llmmesh.edge.responses import ResponsesHandler
from llmmesh.edge.retrieval_calls import RetrievalCalls
from llmmesh.edge.security_headers import SecurityHeadersMiddleware
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.routes import StreamRoutes
from llmmesh.edge.text_completions import TextCompletionsHandler
from llmmesh.edge.vector_stores import VectorStoreRoutes
from llmmesh.edge.web_routes import web_routes

log = logging.getLogger(__name__)


def build_app(settings: EdgeSettings, mesh: MeshClient) -> Starlette:
    """The edge application over a mesh client."""
    completions = CompletionsHandler(settings, mesh)
    conversations = ConversationsHandler(settings, mesh, completions)
    text_completions = TextCompletionsHandler(settings, mesh, completions)
    streams = StreamRoutes(mesh, completions.streams)
    retrieval = RetrievalCalls(mesh)
    readiness = edge_readiness(settings, mesh, completions.streams.logs)
    ops = OpsRoutes(settings, mesh)

    async def usage(request: Request) -> Response:
        principal = await authenticate(request, mesh)
        period = request.query_params.get("period", "")
        if period and not PERIOD.match(period):
            raise OpenAIError(400, "period must be a month, 'YYYY-MM'", param="period", code="invalid_value")
        totals = await mesh.usage(principal.tenant.id, period)
        return JSONResponse(
            {
                "object": "usage",
                "period": totals.period,
                "input_tokens": totals.input_tokens,
                "output_tokens": totals.output_tokens,
                # A decimal string: exact, as billing computes it.
                "cost_usd": totals.cost_usd,
                "requests": totals.requests,
                # By model and purpose: background work (summaries, memory) is a line of its own.
                "lines": [
                    {
                        "model": line.model,
                        "purpose": purpose_name(line.purpose),
                        "input_tokens": line.input_tokens,
                        "output_tokens": line.output_tokens,
                        "cost_usd": line.cost_usd,
                        "requests": line.requests,
                    }
                    for line in totals.models
                ],
            }
        )

    async def healthz(request: Request) -> Response:
        ok, detail = await path_health(mesh)
        return JSONResponse(detail, status_code=200 if ok else 503)

    async def readyz(request: Request) -> Response:
        # Dependencies only: a region outage is failed over, not a reason to stop taking requests.
        report = await readiness.fresh()
        return JSONResponse(report.body(), status_code=200 if report.ready else 503)

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def docs(request: Request) -> Response:
        return HTMLResponse(docs_page(), headers={"content-security-policy": DOCS_POLICY})

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def on_openai_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIError)
        return exc.response()

    async def on_mesh_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MeshError)
        return from_mesh_error(exc).response()

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        status = exc.status_code if exc.status_code in (404, 405) else 400
        error = OpenAIError(status, f"{request.method} {request.url.path}: {exc.detail}", code=code)
        # A 405 keeps its Allow header.
        return error.response(dict(exc.headers or {}))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return OpenAIError(500, "internal error", type="server_error", code="internal_error").response()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await completions.streams.start()
        readiness.start()
        ops.start()
        yield
        await ops.close()
        await readiness.close()
        await completions.streams.close()
        await mesh.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", completions.handle, methods=["POST"]),
            Route("/v1/completions", text_completions.handle, methods=["POST"]),
            *ResponsesHandler(settings, mesh, completions).routes(),
            Route("/v1/streams/{stream_id}", streams.resume, methods=["GET"]),
            Route("/v1/streams/{stream_id}/cancel", streams.cancel, methods=["POST"]),
            *ModelRoutes(mesh).routes(),
            Route("/v1/usage", usage, methods=["GET"]),
            Route("/v1/embeddings", EmbeddingsHandler(settings, mesh).handle, methods=["POST"]),
            Route("/v1/moderations", ModerationsHandler(settings, mesh).handle, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/docs", docs, methods=["GET"]),
            *conversations.routes(),
            *FileRoutes(settings, retrieval).routes(),
            *VectorStoreRoutes(settings, retrieval).routes(),
            *FileBatchRoutes(settings, retrieval).routes(),
            *MemoryRoutes(mesh).routes(),
            *web_routes(),
            *ops.routes(),
        ],
        exception_handlers={
            OpenAIError: on_openai_error,
            MeshError: on_mesh_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
        middleware=[
            Middleware(SecurityHeadersMiddleware),
            Middleware(RequestSpanMiddleware),
            Middleware(BodyLimitMiddleware, limit=settings.max_body_bytes),
        ],
        lifespan=lifespan,
    )

    return app


class RequestCounter(ResponseStartMiddleware):
    """Counts answered requests by route and status."""

    def on_start(self, scope: Scope, status: int, headers: Headers) -> None:
        route = scope.get("route")
        metrics.REQUESTS.labels(route=getattr(route, "path", "other"), status=str(status)).inc()
