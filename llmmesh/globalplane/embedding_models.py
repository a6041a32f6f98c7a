"""The embedding model every mesh's catalog starts with, beside its chat
model: ``llmmesh-tiny-embed`` (simulator pods embed with it by default;
:mod:`engine.embedding_model` builds it for vLLM). It is no tier's default,
so ``auto`` never resolves to it; its kind keeps it out of chat turns (and
chat models out of embeddings); and it is priced per input token only: an
embedding has no output tokens."""

from __future__ import annotations

from decimal import Decimal

from llmmesh.globalplane.model_catalog import Model, ModelKind, ModelTier, parse_price
from llmmesh.globalplane.settings import GlobalSettings


def embedding_models(settings: GlobalSettings) -> list[Model]:
    """The configured embedding model, or none when ``settings.embedding_model`` is empty."""
    if not settings.embedding_model:
        return []
    return [
        Model(
            name=settings.embedding_model,
            tier=ModelTier.SMALL,
            context_window=settings.embedding_model_context_window,
            input_per_1k_usd=parse_price(
                settings.embedding_model_input_per_1k_usd, "embedding_model_input_per_1k_usd"
            ),
            output_per_1k_usd=Decimal(0),
            kind=ModelKind.EMBEDDING,
        )
    ]
