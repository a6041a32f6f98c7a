"""``ModelRegistryService``: a thin gRPC face on :class:`ModelCatalog`."""

from __future__ import annotations

from collections.abc import Iterable

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.model_catalog import Model, ModelCatalog, ModelKind, ModelTier, parse_price
from llmmesh.globalplane.protoconv import required_tier, tier_to_proto
from llmmesh.globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import common_pb2, model_registry_service_pb2_grpc
from llmmesh.v1 import model_registry_service_pb2 as mpb

SERVICE_NAME = "llmmesh.v1.ModelRegistryService"

_MODEL_TIER_TO_PROTO: dict[ModelTier, mpb.ModelTier.ValueType] = {
    ModelTier.SMALL: mpb.MODEL_TIER_SMALL,
    ModelTier.LARGE: mpb.MODEL_TIER_LARGE,
    ModelTier.FRONTIER: mpb.MODEL_TIER_FRONTIER,
}
_MODEL_TIER_FROM_PROTO = {v: k for k, v in _MODEL_TIER_TO_PROTO.items()}
_MODEL_KIND_TO_PROTO: dict[ModelKind, mpb.ModelKind.ValueType] = {
    ModelKind.CHAT: mpb.MODEL_KIND_CHAT,
    ModelKind.EMBEDDING: mpb.MODEL_KIND_EMBEDDING,
}
# A client from before models had a kind upserts chat models.
_MODEL_KIND_FROM_PROTO = {v: k for k, v in _MODEL_KIND_TO_PROTO.items()} | {
    mpb.MODEL_KIND_UNSPECIFIED: ModelKind.CHAT
}


def _tiers_to_proto(tiers: frozenset[TenantTier]) -> list[common_pb2.Tier.ValueType]:
    return sorted(tier_to_proto(t) for t in tiers)


def _tiers_from_proto(tiers: Iterable[common_pb2.Tier.ValueType], param: str) -> frozenset[TenantTier]:
    return frozenset(required_tier(t, param) for t in tiers)


def model_to_proto(model: Model) -> mpb.Model:
    return mpb.Model(
        name=model.name,
        tier=_MODEL_TIER_TO_PROTO[model.tier],
        context_window=model.context_window,
        pricing=mpb.ModelPricing(
            input_per_1k_usd=format(model.input_per_1k_usd, "f"),
            output_per_1k_usd=format(model.output_per_1k_usd, "f"),
        ),
        tokenizer_family=model.tokenizer_family,
        chat_template_family=model.chat_template_family,
        deployments=[
            mpb.ModelDeployment(region=d.region, engine_pods=d.engine_pods) for d in model.deployments
        ],
        default_for_tiers=_tiers_to_proto(model.default_for_tiers),
        allowed_tiers=_tiers_to_proto(model.allowed_tiers),
        retired=model.retired,
        canary_of=model.canary_of,
        canary_percent=model.canary_percent,
        canaries=[mpb.ModelCanary(name=name, percent=percent) for name, percent in model.canaries],
        kind=_MODEL_KIND_TO_PROTO[model.kind],
    )


def model_from_proto(model: mpb.Model) -> Model:
    """The model to upsert; deployments and canaries are ignored (they come
    from region heartbeats and from the canaries' own ``canary_of``)."""
    tier = _MODEL_TIER_FROM_PROTO.get(model.tier)
    if tier is None:
        raise InvalidArgument(Reason.INVALID_REQUEST, "model tier must be set", metadata={"param": "tier"})
    kind = _MODEL_KIND_FROM_PROTO.get(model.kind)
    if kind is None:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"unknown model kind {model.kind}: MODEL_KIND_CHAT or MODEL_KIND_EMBEDDING",
            metadata={"param": "kind"},
        )
    return Model(
        name=model.name,
        tier=tier,
        context_window=model.context_window,
        input_per_1k_usd=parse_price(model.pricing.input_per_1k_usd, "pricing.input_per_1k_usd"),
        output_per_1k_usd=parse_price(model.pricing.output_per_1k_usd, "pricing.output_per_1k_usd"),
        tokenizer_family=model.tokenizer_family,
        chat_template_family=model.chat_template_family,
        default_for_tiers=_tiers_from_proto(model.default_for_tiers, "default_for_tiers"),
        allowed_tiers=_tiers_from_proto(model.allowed_tiers, "allowed_tiers"),
        retired=model.retired,
        canary_of=model.canary_of,
        canary_percent=model.canary_percent,
        kind=kind,
    )


# Method names are the RPC names the generated base class declares (hence N802).
class ModelRegistryServicer(model_registry_service_pb2_grpc.ModelRegistryServiceServicer):
    """Models, their prices, tiers and deployments."""

    def __init__(self, catalog: ModelCatalog, audit: AuditLog) -> None:
        self._catalog = catalog
        self._audit = audit

    async def ListModels(
        self, request: mpb.ListModelsRequest, context: ServicerContext
    ) -> mpb.ListModelsResponse:
        async with abort_on_mesh_error(context):
            page = await self._catalog.list_models(request.page_size, request.page_token)
            return mpb.ListModelsResponse(
                models=[model_to_proto(m) for m in page.items], next_page_token=page.next_page_token
            )

    async def GetModel(self, request: mpb.GetModelRequest, context: ServicerContext) -> mpb.GetModelResponse:
        async with abort_on_mesh_error(context):
            return mpb.GetModelResponse(model=model_to_proto(await self._catalog.get_model(request.name)))

    async def ResolveModel(
        self, request: mpb.ResolveModelRequest, context: ServicerContext
    ) -> mpb.ResolveModelResponse:
        async with abort_on_mesh_error(context):
            tier = required_tier(request.tenant_tier, "tenant_tier")
            return mpb.ResolveModelResponse(
                model=model_to_proto(await self._catalog.resolve(request.name, tier))
            )

    async def UpsertModel(
        self, request: mpb.UpsertModelRequest, context: ServicerContext
    ) -> mpb.UpsertModelResponse:
        async with abort_on_mesh_error(context):
            stored = await self._catalog.upsert_model(model_from_proto(request.model))
            await self._audit.record("UpsertModel", stored.name, request)
            return mpb.UpsertModelResponse(model=model_to_proto(stored))
