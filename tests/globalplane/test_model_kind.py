"""A model's kind: chat models take turns, embedding models embed; the
registry keeps each, old stores read as chat, and the global plane gives
the embedding model it starts with its kind."""

from __future__ import annotations

import dataclasses

import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.errors import FailedPrecondition, InvalidArgument
from llmmesh.globalplane import schema
from llmmesh.globalplane.embedding_models import embedding_models
from llmmesh.globalplane.model_catalog import ModelCatalog, ModelKind, default_model
from llmmesh.globalplane.registry_servicer import model_from_proto, model_to_proto
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import model_registry_service_pb2 as mpb

SETTINGS = GlobalSettings()
(EMBED,) = embedding_models(SETTINGS)
CHAT = default_model(SETTINGS)

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def catalog(store: GlobalStore) -> ModelCatalog:
    catalog = ModelCatalog(store)
    await catalog.add_missing([CHAT, EMBED])
    return catalog


async def test_the_catalog_starts_with_a_chat_model_and_an_embedding_model(catalog: ModelCatalog) -> None:
    kinds = {m.name: m.kind for m in (await catalog.list_models()).items}
    assert kinds == {CHAT.name: ModelKind.CHAT, EMBED.name: ModelKind.EMBEDDING}
    assert model_to_proto(await catalog.get_model(EMBED.name)).kind == mpb.MODEL_KIND_EMBEDDING


async def test_an_embedding_model_is_no_tiers_default_and_no_chat_models_canary(
    catalog: ModelCatalog,
) -> None:
    with pytest.raises(InvalidArgument) as default:
        await catalog.upsert_model(dataclasses.replace(EMBED, default_for_tiers=frozenset({TenantTier.PRO})))
    assert default.value.metadata["param"] == "default_for_tiers"
    canary = dataclasses.replace(EMBED, name="embed-v2", canary_of=CHAT.name, canary_percent=10)
    with pytest.raises(FailedPrecondition) as mixed:
        await catalog.upsert_model(canary)
    assert mixed.value.metadata["param"] == "kind"
    assert "a chat model; this one is an embedding model" in mixed.value.message
    # A canary of the embedding model is an embedding model.
    await catalog.upsert_model(dataclasses.replace(canary, canary_of=EMBED.name))


async def test_a_model_stored_before_kinds_reads_as_chat_until_the_plane_starts_it_with_its_kind(
    store: GlobalStore, catalog: ModelCatalog
) -> None:
    await store.transaction(lambda conn: conn.execute(sa.update(schema.models).values(kind=None)))
    assert {m.kind for m in (await catalog.list_models()).items} == {ModelKind.CHAT}
    before = await catalog.version()
    await ModelCatalog(store).add_missing([CHAT, EMBED])
    assert (await catalog.get_model(EMBED.name)).kind is ModelKind.EMBEDDING
    assert (await catalog.get_model(CHAT.name)).kind is ModelKind.CHAT
    # Regions hear of the change through the catalog's version.
    assert await catalog.version() != before


async def test_an_upsert_names_its_kind_or_is_a_chat_model_and_an_unknown_kind_is_refused() -> None:
    message = model_to_proto(EMBED)
    assert model_from_proto(message).kind is ModelKind.EMBEDDING
    message.kind = mpb.MODEL_KIND_UNSPECIFIED
    assert model_from_proto(message).kind is ModelKind.CHAT
    message.kind = 7  # type: ignore[assignment]
    with pytest.raises(InvalidArgument) as unknown:
        model_from_proto(message)
    assert unknown.value.metadata["param"] == "kind"
