from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
import pytest_asyncio

from llmmesh.core.errors import InvalidArgument, NotFound, PermissionDenied, Reason
from llmmesh.globalplane.model_catalog import (
    SIM_FAMILY,
    Model,
    ModelCatalog,
    ModelDeployment,
    ModelTier,
    default_model,
    parse_price,
)
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tiers import TenantTier

BIG = Model(
    "llmmesh-big",
    ModelTier.LARGE,
    32768,
    Decimal("0.003"),
    Decimal("0.006"),
    default_for_tiers=frozenset({TenantTier.ENTERPRISE}),
    allowed_tiers=frozenset({TenantTier.PRO, TenantTier.ENTERPRISE}),
)


@pytest_asyncio.fixture
async def catalog(store: GlobalStore) -> ModelCatalog:
    catalog = ModelCatalog(store)
    await catalog.add_missing([default_model(GlobalSettings())])
    return catalog


def test_default_model_comes_from_settings() -> None:
    model = default_model(GlobalSettings(default_model="tiny", default_model_input_per_1k_usd="0.01"))
    assert (model.name, model.tier, model.input_per_1k_usd) == ("tiny", ModelTier.SMALL, Decimal("0.01"))
    assert model.tokenizer_family == model.chat_template_family == SIM_FAMILY
    assert model.default_for_tiers == frozenset(TenantTier)


@pytest.mark.asyncio
async def test_auto_resolves_to_the_tier_default(catalog: ModelCatalog) -> None:
    for tier in TenantTier:
        assert (await catalog.resolve("auto", tier)).name == "llmmesh-tiny"
    await catalog.upsert_model(BIG)
    assert (await catalog.resolve("auto", TenantTier.ENTERPRISE)).name == "llmmesh-big"
    assert (await catalog.resolve("", TenantTier.PRO)).name == "llmmesh-tiny"
    assert TenantTier.ENTERPRISE not in (await catalog.get_model("llmmesh-tiny")).default_for_tiers


@pytest.mark.asyncio
async def test_named_model_respects_allowed_tiers(catalog: ModelCatalog) -> None:
    await catalog.upsert_model(BIG)
    assert (await catalog.resolve("llmmesh-big", TenantTier.PRO)).name == "llmmesh-big"
    with pytest.raises(PermissionDenied) as info:
        await catalog.resolve("llmmesh-big", TenantTier.FREE)
    assert info.value.reason == Reason.MODEL_NOT_ALLOWED
    with pytest.raises(NotFound) as missing:
        await catalog.resolve("gpt-none", TenantTier.PRO)
    assert missing.value.reason == Reason.UNKNOWN_MODEL


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"name": "auto"}, "name"),
        ({"name": ""}, "name"),
        ({"context_window": 0}, "context_window"),
        ({"input_per_1k_usd": Decimal("-0.1")}, "pricing.input_per_1k_usd"),
        ({"output_per_1k_usd": Decimal("NaN")}, "pricing.output_per_1k_usd"),
        ({"default_for_tiers": frozenset({TenantTier.FREE})}, "default_for_tiers"),
    ],
)
async def test_upsert_validates(catalog: ModelCatalog, change: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await catalog.upsert_model(dataclasses.replace(BIG, **change))  # type: ignore[arg-type]
    assert info.value.metadata["param"] == param


def test_parse_price_rejects_garbage() -> None:
    assert parse_price(" 0.25 ", "p") == Decimal("0.25")
    for bad in ["", "abc", "-1", "inf"]:
        with pytest.raises(InvalidArgument):
            parse_price(bad, "p")


@pytest.mark.asyncio
async def test_deployments_come_from_the_source(store: GlobalStore) -> None:
    catalog = ModelCatalog(
        store, lambda name: [ModelDeployment("eu-west", 2)] if name == "llmmesh-tiny" else []
    )
    await catalog.add_missing([default_model(GlobalSettings())])
    assert (await catalog.get_model("llmmesh-tiny")).deployments == (ModelDeployment("eu-west", 2),)
    page = await catalog.list_models()
    assert [m.deployments for m in page.items] == [(ModelDeployment("eu-west", 2),)]
