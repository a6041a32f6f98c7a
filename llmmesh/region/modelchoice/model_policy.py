"""What a region decides about a resolved model: whether the tenant may use
it, and what a turn on it costs."""

from __future__ import annotations

from collections.abc import Collection
from decimal import Decimal

from llmmesh.core import pricing
from llmmesh.core.errors import InvalidArgument, PermissionDenied, Reason
from llmmesh.v1 import model_registry_service_pb2


def require_allowed(model: model_registry_service_pb2.Model, allowed: list[str]) -> None:
    """PERMISSION_DENIED ``MODEL_NOT_ALLOWED`` unless ``allowed`` is empty or names it."""
    if allowed and model.name not in allowed:
        raise PermissionDenied(
            Reason.MODEL_NOT_ALLOWED,
            f"model {model.name!r} is not allowed for this tenant",
            metadata={"param": "model"},
        )


def require_chat_model(
    model: model_registry_service_pb2.Model, chat_models: Collection[str], embedding_models: Collection[str]
) -> None:
    """INVALID_ARGUMENT ``MODEL_WRONG_KIND`` (param ``model``) for a chat
    turn on a model the registry lists as an embedding model, or one the
    region's pods only embed with: no pod could ever generate with it, so
    the refusal is final rather than UNAVAILABLE."""
    embedding = model.kind == model_registry_service_pb2.MODEL_KIND_EMBEDDING
    if embedding or (model.name in embedding_models and model.name not in chat_models):
        raise InvalidArgument(
            Reason.MODEL_WRONG_KIND,
            f"model {model.name!r} is an embedding model; use /v1/embeddings with it",
            metadata={"param": "model"},
        )


def turn_cost(model: model_registry_service_pb2.Model, input_tokens: int, output_tokens: int) -> Decimal:
    """Exact USD cost of a turn at the model's prices, as billing computes it."""
    prices = model.pricing
    return pricing.turn_cost(
        Decimal(prices.input_per_1k_usd or "0"),
        Decimal(prices.output_per_1k_usd or "0"),
        input_tokens,
        output_tokens,
    )
