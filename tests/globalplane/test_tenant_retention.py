"""A tenant's conversation retention: set at creation or by an update
(0 is the region's default), refused out of range, carried in the zone's
policy snapshot, and added with 0 to a tenants table of an earlier version
(SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from llmmesh.core.errors import InvalidArgument
from llmmesh.globalplane import schema
from llmmesh.globalplane.policy_records import TenantUpdate
from llmmesh.globalplane.policy_servicer import tenant_to_proto
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from tests.globalplane.manual_clock import ManualClock
from tests.globalplane.older_store import as_before_migrations

pytestmark = pytest.mark.asyncio


async def test_retention_is_set_updated_and_checked(store: GlobalStore) -> None:
    book = TenantBook(store, ManualClock())
    tenant = await book.create_tenant("acme", "eu", TenantTier.PRO, conversation_retention_days=7)
    assert (await book.get_tenant(tenant.id)).conversation_retention_days == 7
    assert tenant_to_proto(tenant).conversation_retention_days == 7
    updated = await book.update_tenant(tenant.id, TenantUpdate(conversation_retention_days=0))
    assert updated.conversation_retention_days == 0
    kept = await book.update_tenant(tenant.id, TenantUpdate(rpm_limit=5))
    assert kept.conversation_retention_days == 0
    for days in (-1, 3651):
        with pytest.raises(InvalidArgument) as info:
            await book.create_tenant(f"t{days}", "eu", TenantTier.PRO, conversation_retention_days=days)
        assert info.value.metadata["param"] == "conversation_retention_days"
        with pytest.raises(InvalidArgument):
            await book.update_tenant(tenant.id, TenantUpdate(conversation_retention_days=days))


async def test_an_older_tenants_table_gets_the_column(store: GlobalStore) -> None:
    book = TenantBook(store, ManualClock())
    tenant = await book.create_tenant("old", "us", TenantTier.FREE, conversation_retention_days=3)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {schema.tenants.name} DROP COLUMN conversation_retention_days")
        as_before_migrations(conn)
    store.create_schema()
    store.create_schema()  # a current table is left alone
    with store.engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns(schema.tenants.name)}
    assert "conversation_retention_days" in columns
    assert (await book.get_tenant(tenant.id)).conversation_retention_days == 0
