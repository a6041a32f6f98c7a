"""Model resolution through the global model registry, cached.

A cached answer keeps a region serving known models while the registry is
unreachable; only a never-seen name needs the global plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal

import grpc

from llmmesh import pricing as llmmesh_pricing
from llmmesh.errors import MeshError, PermissionDenied, Reason, Unavailable, from_rpc_error
from llmmesh.v1 import common_pb2, model_registry_service_pb2, model_registry_service_pb2_grpc


class ModelDirectory:
    """Resolves requested model names for a tenant tier."""

    def __init__(
        self,
        stub: model_registry_service_pb2_grpc.ModelRegistryServiceStub,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stub = stub
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[tuple[str, int], tuple[float, model_registry_service_pb2.Model]] = {}

    async def resolve(
        self, name: str, tier: common_pb2.Tier.ValueType, allowed: list[str] | None = None
    ) -> model_registry_service_pb2.Model:
        """The model ``name`` ("auto" included) means for ``tier``."""
        key = (name or "auto", int(tier))
        hit = self._cache.get(key)
        if hit is not None and self._clock() - hit[0] < self._ttl_s:
            model = hit[1]
        else:
            try:
                resp = await self._stub.ResolveModel(
                    model_registry_service_pb2.ResolveModelRequest(name=key[0], tenant_tier=tier), timeout=5.0
                )
            except grpc.aio.AioRpcError as err:
                mesh_err: MeshError = from_rpc_error(err)
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    if hit is not None:
                        return hit[1]
                    mesh_err = Unavailable(
                        Reason.GLOBAL_PLANE_UNAVAILABLE,
                        "the model registry is unreachable",
                        retry_after_s=1.0,
                    )
                raise mesh_err from err
            model = resp.model
            self._cache[key] = (self._clock(), model)
        if allowed and model.name not in allowed:
            raise PermissionDenied(
                Reason.MODEL_NOT_ALLOWED,
                f"model {model.name!r} is not allowed for this tenant",
                metadata={"param": "model"},
            )
        return model


def turn_cost(model: model_registry_service_pb2.Model, input_tokens: int, output_tokens: int) -> Decimal:
    """Exact USD cost of a turn at the model's prices, as billing computes it."""
    pricing = model.pricing
    return llmmesh_pricing.turn_cost(
        Decimal(pricing.input_per_1k_usd or "0"),
        Decimal(pricing.output_per_1k_usd or "0"),
        input_tokens,
        output_tokens,
    )
