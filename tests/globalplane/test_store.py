"""The global store under concurrency, restarts and price changes.

``store`` runs each test on SQLite and on PostgreSQL; ``postgres_stores``
opens several engines (separate pools, as two global-plane processes would)
on one PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmmesh.core.errors import AlreadyExists
from llmmesh.globalplane import schema
from llmmesh.globalplane.model_catalog import Model, ModelCatalog, ModelTier
from llmmesh.globalplane.server import ensure_dev_tenant
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore, create_store_engine, default_database_url
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.globalplane.usage_ledger import UsageLedger, UsageRecord
from tests.globalplane.conftest import StoreFactory
from tests.globalplane.manual_clock import ManualClock

MODEL = Model("m", ModelTier.SMALL, 4096, Decimal("0.0005"), Decimal("0.0015"))


async def _billing(store: GlobalStore, clock: ManualClock) -> tuple[TenantBook, UsageLedger]:
    await ModelCatalog(store, clock=clock).add_missing([MODEL])
    return TenantBook(store, clock), UsageLedger(store, clock)


def _batch(tenant_id: str, ids: range) -> list[UsageRecord]:
    return [UsageRecord(f"req-{i}", tenant_id, "m", "eu-west", 1000, 2000) for i in ids]


def _stored_request_ids(store: GlobalStore) -> list[str]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.select(schema.usage_records.c.request_id)).scalars())


@pytest.mark.asyncio
@pytest.mark.services
async def test_two_engines_delivering_overlapping_batches_bill_each_request_once(
    postgres_stores: StoreFactory,
) -> None:
    clock = ManualClock()
    first, second = postgres_stores(), postgres_stores()
    tenants, ledger_a = await _billing(first, clock)
    ledger_b = UsageLedger(second, clock)
    tid = (await tenants.create_tenant("acme", "eu", TenantTier.PRO)).id
    # Overlapping windows in opposite orders: the worst case for lock ordering.
    batches = [_batch(tid, range(40)), _batch(tid, range(20, 60))[::-1], _batch(tid, range(60))]
    deliveries = [ledger.record(b) for b in batches for ledger in (ledger_a, ledger_b) for _ in range(4)]
    outcomes = await asyncio.gather(*deliveries)
    assert sum(o.accepted for o in outcomes) == 60
    assert sum(o.accepted + o.duplicates for o in outcomes) == 8 * (40 + 40 + 60)
    assert sorted(_stored_request_ids(first)) == sorted(f"req-{i}" for i in range(60))
    totals = await ledger_b.usage(tid)
    assert (totals.requests, totals.input_tokens, totals.output_tokens) == (60, 60_000, 120_000)
    assert totals.cost_usd == 60 * Decimal("0.0035")


@pytest.mark.asyncio
@pytest.mark.services
async def test_racing_creations_of_one_tenant_name_leave_one(postgres_stores: StoreFactory) -> None:
    books = [TenantBook(postgres_stores()), TenantBook(postgres_stores())]
    results = await asyncio.gather(
        *(books[i % 2].create_tenant("acme", "eu", TenantTier.PRO) for i in range(10)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, AlreadyExists) for r in results if isinstance(r, BaseException))
    assert [t.name for t in (await books[1].list_tenants()).items] == ["acme"]


@pytest.mark.asyncio
async def test_costs_use_the_price_at_ingestion(store: GlobalStore) -> None:
    clock = ManualClock()
    tenants, ledger = await _billing(store, clock)
    catalog = ModelCatalog(store, clock=clock)
    tid = (await tenants.create_tenant("acme", "eu", TenantTier.PRO)).id
    await ledger.record(_batch(tid, range(1)))
    dearer = dataclasses.replace(MODEL, input_per_1k_usd=Decimal("0.001"), output_per_1k_usd=Decimal("0.1"))
    assert (await catalog.upsert_model(dearer)).output_per_1k_usd == Decimal("0.1")
    await ledger.record(_batch(tid, range(1, 2)))
    # 0.0035 at the old price, then 1000 * 0.001 / 1000 + 2000 * 0.1 / 1000 = 0.201
    assert (await ledger.usage(tid)).cost_usd == Decimal("0.2045")
    with store.engine.connect() as conn:
        revisions = conn.execute(sa.select(schema.model_prices.c.revision).order_by("revision")).scalars()
        assert list(revisions) == [1, 2]


@pytest.mark.asyncio
async def test_tiny_prices_and_huge_counts_stay_exact(store: GlobalStore) -> None:
    clock = ManualClock()
    tenants, ledger = await _billing(store, clock)
    await ModelCatalog(store, clock=clock).upsert_model(
        dataclasses.replace(MODEL, input_per_1k_usd=Decimal("0.000000001"), output_per_1k_usd=Decimal("3.3"))
    )
    tid = (await tenants.create_tenant("acme", "eu", TenantTier.PRO)).id
    big = 2**62
    await ledger.record([UsageRecord("r", tid, "m", "eu-west", big, 7)])
    # 4611686018427387904 * 0.000000001 / 1000 + 7 * 3.3 / 1000, digit for digit
    assert (await ledger.usage(tid)).cost_usd == Decimal("4611686.041527387904")


@pytest.mark.asyncio
async def test_a_file_store_survives_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'global.db'}"
    settings = GlobalSettings(dev_key="sk-llmmesh-restart", database_url=url, insecure=True)
    for _ in range(2):
        store = await GlobalStore.open(url)
        try:
            book = TenantBook(store)
            await ensure_dev_tenant(book, settings)
            await ensure_dev_tenant(book, settings)
            tenant, _ = await book.authenticate("sk-llmmesh-restart")
            assert tenant.name == "dev"
            assert len((await book.list_api_keys("dev")).items) == 1
        finally:
            store.dispose()


def test_default_url_lives_under_the_mesh_home(tmp_path: Path) -> None:
    assert default_database_url({"LLMMESH_HOME": str(tmp_path)}) == f"sqlite:///{tmp_path}/global.db"
    assert default_database_url({}).endswith("/.llmmesh/global.db")


@pytest.mark.asyncio
async def test_two_sqlite_engines_share_one_file_without_double_billing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'global.db'}"
    first = await GlobalStore.open(url)
    second = GlobalStore(create_store_engine(url))
    try:
        clock = ManualClock()
        tenants, ledger_a = await _billing(first, clock)
        ledger_b = UsageLedger(second, clock)
        tid = (await tenants.create_tenant("acme", "eu", TenantTier.PRO)).id
        outcomes = await asyncio.gather(
            *(ledger.record(_batch(tid, range(10))) for ledger in (ledger_a, ledger_b) for _ in range(5))
        )
        assert sum(o.accepted for o in outcomes) == 10
        assert (await ledger_a.usage(tid)).requests == 10
    finally:
        first.dispose()
        second.dispose()
