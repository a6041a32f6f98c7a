"""``GET /v1/models`` and ``GET /v1/models/{model}``, and the OpenAI
endpoints the mesh does not serve.

``/v1/completions`` (legacy prompt completions) and the Responses API
(``/v1/responses`` and everything under it) answer 404 with an OpenAI error
object, ``code: "unsupported_endpoint"``, saying to use chat completions:
a client learns at once that the endpoint is missing rather than meeting a
generic 404.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.completions import authenticate
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.v1 import common_pb2, model_registry_service_pb2

_UNSUPPORTED: dict[str, str] = {
    "/v1/completions": "legacy prompt completions are not supported; use POST /v1/chat/completions",
    "/v1/responses": "the Responses API is not supported; use POST /v1/chat/completions",
}


def model_object(model: model_registry_service_pb2.Model) -> dict[str, object]:
    """A model as ``GET /v1/models`` lists it: OpenAI's fields plus the mesh's."""
    return {
        "id": model.name,
        "object": "model",
        "created": 0,
        "owned_by": "llmmesh",
        "tier": model_registry_service_pb2.ModelTier.Name(model.tier).removeprefix("MODEL_TIER_").lower(),
        "context_window": model.context_window,
        "pricing": {
            "input_per_1k_usd": model.pricing.input_per_1k_usd,
            "output_per_1k_usd": model.pricing.output_per_1k_usd,
        },
        "regions": sorted(d.region for d in model.deployments),
        "default_for_tiers": [
            common_pb2.Tier.Name(t).removeprefix("TIER_").lower() for t in model.default_for_tiers
        ],
    }


def unsupported_endpoint(path: str) -> OpenAIError:
    """The 404 of an OpenAI endpoint the mesh does not serve."""
    prefix = "/v1/responses" if path.startswith("/v1/responses") else path
    message = _UNSUPPORTED.get(prefix, "this endpoint is not supported")
    return OpenAIError(404, f"{path}: {message}", code="unsupported_endpoint")


class ModelRoutes:
    """The model list, one model, and the unsupported endpoints."""

    def __init__(self, mesh: MeshClient) -> None:
        self._mesh = mesh

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list, methods=["GET"]),
            Route("/v1/models/{model:path}", self.get, methods=["GET"]),
            Route("/v1/completions", self.unsupported, methods=["POST"]),
            Route("/v1/responses", self.unsupported, methods=["POST"]),
            Route("/v1/responses/{rest:path}", self.unsupported, methods=["GET", "POST", "DELETE"]),
        ]

    async def list(self, request: Request) -> Response:
        await authenticate(request, self._mesh)
        models = await self._mesh.list_models()
        # A retired model is kept in the registry (its prices explain old bills) but served no more.
        return JSONResponse({"object": "list", "data": [model_object(m) for m in models if not m.retired]})

    async def get(self, request: Request) -> Response:
        """One model by name; a 404 ``model_not_found`` when there is none."""
        await authenticate(request, self._mesh)
        name = request.path_params["model"]
        for model in await self._mesh.list_models():
            if model.name == name and not model.retired:
                return JSONResponse(model_object(model))
        raise OpenAIError(404, f"The model '{name}' does not exist.", param="model", code="model_not_found")

    async def unsupported(self, request: Request) -> Response:
        await authenticate(request, self._mesh)
        raise unsupported_endpoint(request.url.path)
