"""A deleted tenant's zone-bound data purged by the region's sweep: every
conversation with its messages and summaries, every file, vector store and
chunk (their sqlite-vec and FTS5 entries too), every fact about its end
users; the usage outbox kept; other tenants untouched; purged again within
the grace, for turns that were still running, and left alone after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy as sa

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_text import query_terms
from llmmesh.region.lifecycle.tenant_purge import TenantPurge
from llmmesh.region.zone_store import schema as zs
from llmmesh.region.zone_store.store import ZoneStore
from tests.region.test_vector_store import DIMS, embed
from tests.region.test_zone_store import REPLY, usage

pytestmark = pytest.mark.asyncio
GONE, KEPT = "ten_gone", "ten_kept"


@dataclass
class Snapshot:
    """The policy cache's deleted tenants."""

    deleted: list[str] = field(default_factory=list)

    def deleted_tenant_ids(self) -> list[str]:
        return list(self.deleted)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Zone:
    store: ZoneStore
    retrieval: VectorStoreDb
    memories: MemoryStore


@pytest_asyncio.fixture
async def zone(tmp_path: Path) -> AsyncIterator[Zone]:
    url = f"sqlite:///{tmp_path / 'zone-eu.db'}"
    store = ZoneStore(create_store_engine(url), "eu", "eu-west")
    store.create_schema()
    retrieval = await VectorStoreDb.open(url, "eu-west", dimensions=DIMS)
    memories = MemoryStore(retrieval)
    await asyncio.to_thread(memories.create_schema)
    yield Zone(store, retrieval, memories)
    retrieval.dispose()
    store.dispose()


async def _fill(zone: Zone, tenant: str) -> str:
    """A conversation with a turn, a vector store with a file, a fact; the store's id."""
    conv = await zone.store.create_conversation(tenant, "m")
    await zone.store.record_turn(
        tenant, conv.id, f"req-{tenant}", "my secret plan", REPLY, usage(f"req-{tenant}", tenant)
    )
    store = await zone.retrieval.create_vector_store(tenant, f"vs_{tenant}", "notes", {})
    text = "the secret plan is to sail at dawn"
    await zone.retrieval.create_file(tenant, f"file_{tenant}", "plan.txt", "assistants", text.encode())
    await zone.retrieval.add_file(tenant, store.id, f"file_{tenant}", [(text, embed(text))], (200, 20))
    await zone.memories.remember(tenant, "ann", ["Ann lives in Lyon."], f"req-{tenant}")
    return store.id


def _rows(zone: Zone, table: sa.Table, tenant: str) -> int:
    query = sa.select(sa.func.count()).select_from(table).where(table.c.tenant_id == tenant)
    return int(zone.store.run_transaction(lambda conn: conn.execute(query).scalar_one()))


async def _hits(zone: Zone, tenant: str, store_id: str) -> int:
    query = "secret plan"
    return len(await zone.retrieval.search(tenant, [store_id], embed(query), query_terms(query), 5))


def _indexed(zone: Zone) -> tuple[int, int]:
    """Entries of the sqlite-vec table and of the FTS5 table, every tenant's."""
    with zone.retrieval.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
            for table in (f"retrieval_vec_{DIMS}", "retrieval_chunk_text")
        )


async def test_a_deleted_tenants_zone_data_is_purged_and_no_one_elses(zone: Zone) -> None:
    gone_store, kept_store = await _fill(zone, GONE), await _fill(zone, KEPT)
    assert await _hits(zone, GONE, gone_store) == 1 and _indexed(zone) == (2, 2)
    snapshot, clock = Snapshot(), Clock()
    purge = TenantPurge(snapshot, [zone.store, zone.retrieval, zone.memories], grace_s=60, clock=clock)
    assert await purge.sweep() == 0  # nobody deleted yet

    snapshot.deleted.append(GONE)
    assert await purge.sweep() > 0
    for table in (zs.conversations, zs.messages):
        assert (_rows(zone, table, GONE), _rows(zone, table, KEPT)) == (
            0,
            1 if table is zs.conversations else 2,
        )
    assert _rows(zone, zs.usage_outbox, GONE) == 1  # billing's, still shipped
    assert (await zone.retrieval.list_files(GONE, "", 10, "")).rows == []
    assert (await zone.retrieval.list_vector_stores(GONE, 10, "")).rows == []
    assert (await zone.memories.recall(GONE, "ann", 10)).rows == []
    # The search indexes hold nothing of it either; the other tenant's data is whole.
    assert _indexed(zone) == (1, 1)
    assert await _hits(zone, KEPT, kept_store) == 1
    assert [m.content for m in (await zone.memories.recall(KEPT, "ann", 10)).rows] == ["Ann lives in Lyon."]

    # A turn that was still running records after the first sweep: purged again within the grace.
    conv = await zone.store.create_conversation(GONE, "m")
    await zone.store.record_turn(GONE, conv.id, "req-late", "late", REPLY, usage("req-late", GONE))
    clock.now = 30
    assert await purge.sweep() == 3  # the conversation and its two messages
    assert _rows(zone, zs.conversations, GONE) == 0
    # Past the grace the tenant is left alone.
    await zone.store.create_conversation(GONE, "m")
    clock.now = 61
    assert await purge.sweep() == 0
