"""A global store written by an earlier version (usage keyed by request id
alone, or keyed by tenant but without end users) is upgraded in place when
the global plane opens it: every record kept, and from then on two tenants'
turns with one request id both billed, and end users kept and found."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmmesh.core.end_user import end_user_pseudonym
from llmmesh.globalplane import schema
from llmmesh.globalplane.migrations import baseline
from llmmesh.globalplane.model_catalog import ModelCatalog, default_model
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.globalplane.usage_ledger import UsageLedger, UsageRecord


def _old_shape(keyed_by_tenant: bool = False) -> sa.MetaData:
    """The tables as the last release before migrations made them (the
    baseline's), with ``usage_records`` as it was: the request id alone the primary key, no
    continuations and no end users; or, ``keyed_by_tenant``, as the version
    before end users were kept."""
    old = sa.MetaData()
    key = {"request_id", "tenant_id"} if keyed_by_tenant else {"request_id"}
    dropped = {"end_user"} if keyed_by_tenant else {"end_user", "continues_request_id"}
    for table in baseline.tables.sorted_tables:
        if table.name == "usage_records":
            columns = [
                sa.Column(c.name, c.type, primary_key=c.name in key, nullable=c.nullable)
                for c in table.columns
                if c.name not in dropped
            ]
            sa.Table(
                table.name, old, *columns, sa.Index("ix_usage_records_tenant_period", "tenant_id", "period")
            )
        else:
            table.to_metadata(old)
    return old


async def _upgrade_and_bill(url: str, keyed_by_tenant: bool = False) -> None:
    engine = sa.create_engine(url)
    _old_shape(keyed_by_tenant).create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.tenants).values(
                id="ten_a",
                name="a",
                zone="us",
                tier="pro",
                rpm_limit=0,
                tpm_limit=0,
                monthly_token_quota=0,
                allowed_models=[],
                create_time=sa.func.now(),
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO usage_records (request_id, tenant_id, model, region, period, input_tokens,"
                " output_tokens, cached_input_tokens, cost_usd, ingest_time)"
                " VALUES ('req-1', 'ten_a', 'llmmesh-tiny', 'us-east', '2026-11', 3, 4, 0, '0.001',"
                " CURRENT_TIMESTAMP)"
            )
        )
    engine.dispose()
    store = await GlobalStore.open(url)
    try:
        inspector = sa.inspect(store.engine)
        assert set(inspector.get_pk_constraint("usage_records")["constrained_columns"]) == {
            "request_id",
            "tenant_id",
        }
        with store.engine.connect() as conn:
            kept = conn.execute(
                sa.text("SELECT request_id, tenant_id, output_tokens FROM usage_records")
            ).all()
        assert [tuple(r) for r in kept] == [("req-1", "ten_a", 4)]
        assert "ix_usage_records_tenant_end_user" in {
            i["name"] for i in inspector.get_indexes("usage_records")
        }
        await ModelCatalog(store, lambda model: []).add_missing([default_model(GlobalSettings())])
        other = await TenantBook(store).create_tenant("b", "eu", TenantTier.PRO)
        ledger = UsageLedger(store)
        outcome = await ledger.record([UsageRecord("req-1", other.id, "llmmesh-tiny", "eu-west", 5, 6)])
        assert outcome.accepted == 1
        assert (await ledger.usage(other.id, "")).output_tokens == 6
        assert await ledger.reconcile(["req-1"], other.id) == []
        # The kept record names no end user; a new one does (by its pseudonym), and is found by it.
        someone = end_user_pseudonym(b"k" * 32, "ten_a", "user-9f2c")
        await ledger.record(
            [UsageRecord("req-2", "ten_a", "llmmesh-tiny", "us-east", 7, 8, end_user=someone)]
        )
        mine = await ledger.usage("ten_a", "", end_user=someone)
        assert (mine.requests, mine.input_tokens, mine.output_tokens) == (1, 7, 8)
        with store.engine.connect() as conn:
            users = conn.execute(
                sa.text("SELECT request_id, end_user FROM usage_records WHERE tenant_id = 'ten_a'")
            )
            assert sorted(tuple(r) for r in users) == [("req-1", None), ("req-2", someone)]
    finally:
        store.dispose()


@pytest.mark.parametrize("keyed_by_tenant", [False, True], ids=["keyed-by-request", "without-end-users"])
def test_a_sqlite_store_is_upgraded(tmp_path: Path, keyed_by_tenant: bool) -> None:
    asyncio.run(_upgrade_and_bill(f"sqlite:///{tmp_path / 'global.db'}", keyed_by_tenant))


@pytest.mark.services
@pytest.mark.parametrize("keyed_by_tenant", [False, True], ids=["keyed-by-request", "without-end-users"])
def test_a_postgresql_store_is_upgraded(postgres_schema_url: str, keyed_by_tenant: bool) -> None:
    asyncio.run(_upgrade_and_bill(postgres_schema_url, keyed_by_tenant))
