"""The catalog's fleet fields: retiring a model and canaries taking a share of a model's turns."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, Reason
from llmmesh.globalplane.migrations import baseline
from llmmesh.globalplane.model_catalog import Model, ModelCatalog, ModelTier, default_model
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tiers import TenantTier

LARGE = Model("llmmesh-large", ModelTier.LARGE, 4096, Decimal("0.002"), Decimal("0.004"))


@pytest_asyncio.fixture
async def catalog(store: GlobalStore) -> ModelCatalog:
    catalog = ModelCatalog(store)
    await catalog.add_missing([default_model(GlobalSettings()), LARGE])
    return catalog


@pytest.mark.asyncio
async def test_a_retired_model_is_listed_but_not_resolved(catalog: ModelCatalog) -> None:
    await catalog.upsert_model(dataclasses.replace(LARGE, retired=True))
    assert (await catalog.get_model("llmmesh-large")).retired
    with pytest.raises(FailedPrecondition) as err:
        await catalog.resolve("llmmesh-large", TenantTier.PRO)
    assert err.value.reason == Reason.MODEL_RETIRED
    # Brought back by an upsert that clears the flag.
    await catalog.upsert_model(LARGE)
    assert (await catalog.resolve("llmmesh-large", TenantTier.PRO)).name == "llmmesh-large"


@pytest.mark.asyncio
async def test_a_tier_default_cannot_be_retired(catalog: ModelCatalog) -> None:
    tiny = await catalog.get_model("llmmesh-tiny")
    with pytest.raises(InvalidArgument) as err:
        await catalog.upsert_model(dataclasses.replace(tiny, retired=True))
    assert err.value.metadata["param"] == "retired"


@pytest.mark.asyncio
async def test_canaries_are_handed_out_with_the_model_they_share(catalog: ModelCatalog) -> None:
    v2 = dataclasses.replace(LARGE, name="llmmesh-large-v2", canary_of="llmmesh-large", canary_percent=10)
    await catalog.upsert_model(v2)
    assert (await catalog.resolve("llmmesh-large", TenantTier.FREE)).canaries == (("llmmesh-large-v2", 10),)
    listed = {m.name: m for m in (await catalog.list_models()).items}
    assert listed["llmmesh-large"].canaries == (("llmmesh-large-v2", 10),)
    # A retired canary takes no share.
    await catalog.upsert_model(dataclasses.replace(v2, retired=True))
    assert (await catalog.get_model("llmmesh-large")).canaries == ()


@pytest.mark.asyncio
async def test_canary_shares_add_up_to_at_most_100(catalog: ModelCatalog) -> None:
    first = dataclasses.replace(LARGE, name="large-a", canary_of="llmmesh-large", canary_percent=60)
    await catalog.upsert_model(first)
    with pytest.raises(FailedPrecondition) as err:
        await catalog.upsert_model(dataclasses.replace(first, name="large-b"))
    assert err.value.metadata["param"] == "canary_percent"
    # The canary's own share may change.
    assert (await catalog.upsert_model(dataclasses.replace(first, canary_percent=100))).canary_percent == 100


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"canary_percent": 101, "canary_of": "llmmesh-tiny"}, "canary_percent"),
        ({"canary_percent": 5}, "canary_of"),
        ({"canary_of": "llmmesh-large", "canary_percent": 5}, "canary_of"),
    ],
)
async def test_bad_canary_fields_are_refused(
    catalog: ModelCatalog, change: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        await catalog.upsert_model(dataclasses.replace(LARGE, **change))  # type: ignore[arg-type]
    assert err.value.metadata["param"] == param


@pytest.mark.asyncio
async def test_a_canary_must_point_at_a_live_plain_model(catalog: ModelCatalog) -> None:
    with pytest.raises(FailedPrecondition) as err:
        await catalog.upsert_model(dataclasses.replace(LARGE, name="x", canary_of="nope", canary_percent=5))
    assert "unknown" in err.value.message
    await catalog.upsert_model(
        dataclasses.replace(LARGE, name="c1", canary_of="llmmesh-large", canary_percent=5)
    )
    with pytest.raises(FailedPrecondition):
        await catalog.upsert_model(dataclasses.replace(LARGE, name="c2", canary_of="c1", canary_percent=5))
    with pytest.raises(FailedPrecondition) as err:
        await catalog.upsert_model(dataclasses.replace(LARGE, retired=True))
    assert "c1" in err.value.message


@pytest.mark.asyncio
async def test_an_older_models_table_gains_the_fleet_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'global.db'}"
    engine = sa.create_engine(url)
    old = sa.MetaData()
    # The tables of the last release before migrations (the baseline's), models without the fleet's columns.
    for table in baseline.tables.sorted_tables:
        if table.name == "models":
            added = ("retired", "canary_of", "canary_percent")
            kept = [
                sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                for c in table.columns
                if c.name not in added
            ]
            sa.Table(table.name, old, *kept)
        else:
            table.to_metadata(old)
    old.create_all(engine)
    engine.dispose()
    store = await GlobalStore.open(url)
    try:
        catalog = ModelCatalog(store)
        await catalog.add_missing([default_model(GlobalSettings())])
        tiny = await catalog.get_model("llmmesh-tiny")
        assert (tiny.retired, tiny.canary_of, tiny.canary_percent) == (False, "", 0)
        columns = {c["name"] for c in sa.inspect(store.engine).get_columns("models")}
        assert {"retired", "canary_of", "canary_percent"} <= columns
    finally:
        store.dispose()
