"""``GET /v1/models`` and ``GET /v1/models/{model}``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.caller import authenticate
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.v1 import common_pb2, model_registry_service_pb2


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
        # Which endpoints take it: chat (completions, responses) or embeddings.
        "kind": "embedding" if model.kind == model_registry_service_pb2.MODEL_KIND_EMBEDDING else "chat",
        "default_for_tiers": [
            common_pb2.Tier.Name(t).removeprefix("TIER_").lower() for t in model.default_for_tiers
        ],
    }


async def zone_models(mesh: MeshClient, zone: str) -> list[model_registry_service_pb2.Model]:
    """The registry's models that a routable region of ``zone`` reports
    serving, their deployments cut to that zone's. A retired model is kept
    in the registry (its prices explain old bills) but served no more; a
    model only other zones serve is not the caller's to use."""
    regions = {s.report.region for s in await mesh.list_regions() if s.report.zone == zone}
    served = []
    for model in await mesh.list_models():
        here = [d for d in model.deployments if d.region in regions]
        if model.retired or not here:
            continue
        del model.deployments[:]
        model.deployments.extend(here)
        served.append(model)
    return served


class ModelRoutes:
    """The model list and one model."""

    def __init__(self, mesh: MeshClient) -> None:
        self._mesh = mesh

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list, methods=["GET"]),
            Route("/v1/models/{model:path}", self.get, methods=["GET"]),
        ]

    async def list(self, request: Request) -> Response:
        """The models the caller's zone serves now, with the zone's regions serving each."""
        caller = await authenticate(request, self._mesh)
        models = await zone_models(self._mesh, caller.tenant.zone)
        return JSONResponse({"object": "list", "data": [model_object(m) for m in models]})

    async def get(self, request: Request) -> Response:
        """One model the caller's zone serves, by name; a 404 ``model_not_found`` otherwise."""
        caller = await authenticate(request, self._mesh)
        name = request.path_params["model"]
        for model in await zone_models(self._mesh, caller.tenant.zone):
            if model.name == name:
                return JSONResponse(model_object(model))
        raise OpenAIError(
            404,
            f"The model '{name}' does not exist or is not served in your zone ({caller.tenant.zone}).",
            param="model",
            code="model_not_found",
        )
