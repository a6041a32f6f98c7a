"""A tenant's memory policy: off unless set, set at creation or by an
update, carried in the policy snapshot, and added (off) to a tenants table
of an earlier version."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from llmmesh.globalplane import schema
from llmmesh.globalplane.policy_records import TenantUpdate
from llmmesh.globalplane.policy_servicer import tenant_to_proto, tenant_update_from_proto
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import policy_service_pb2
from tests.globalplane.manual_clock import ManualClock
from tests.globalplane.older_store import as_before_migrations

pytestmark = pytest.mark.asyncio


async def test_memory_is_off_unless_a_tenant_turns_it_on(store: GlobalStore) -> None:
    book = TenantBook(store, ManualClock())
    plain = await book.create_tenant("plain", "eu", TenantTier.PRO)
    assert plain.memory_enabled is False and tenant_to_proto(plain).memory_enabled is False
    keeps = await book.create_tenant("keeps", "eu", TenantTier.PRO, memory_enabled=True)
    assert (await book.get_tenant(keeps.id)).memory_enabled is True
    update = tenant_update_from_proto(policy_service_pb2.Tenant(memory_enabled=False), ["memory_enabled"])
    assert (await book.update_tenant(keeps.id, update)).memory_enabled is False
    assert (await book.update_tenant(keeps.id, TenantUpdate(rpm_limit=3))).memory_enabled is False


async def test_an_older_tenants_table_gets_memory_off(store: GlobalStore) -> None:
    book = TenantBook(store, ManualClock())
    tenant = await book.create_tenant("old", "us", TenantTier.FREE, memory_enabled=True)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {schema.tenants.name} DROP COLUMN memory_enabled")
        as_before_migrations(conn)
    store.create_schema()
    with store.engine.connect() as conn:
        assert "memory_enabled" in {c["name"] for c in sa.inspect(conn).get_columns(schema.tenants.name)}
    assert (await book.get_tenant(tenant.id)).memory_enabled is False
