"""End users' facts on real engines (an SQLite file, PostgreSQL, and
CockroachDB's SQL emulated on PostgreSQL: ``tests/region/cockroach_emulation.py``):
kept once per user, newest first, paged, bounded, and deleted one by one or
per user, each tenant's apart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmmesh.core.errors import NotFound
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from tests.region.cockroach_emulation import RETRIEVAL_ENGINES, retrieval_url

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=RETRIEVAL_ENGINES)
def zone_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The zone store's URL on each engine retrieval runs on."""
    with retrieval_url(request, tmp_path) as url:
        yield url


async def test_facts_are_kept_once_paged_and_forgotten(zone_url: str) -> None:
    db = await VectorStoreDb.open(zone_url, "us-east")
    store = MemoryStore(db)
    try:
        await asyncio.to_thread(store.create_schema)
        assert await store.remember("t1", "ann", ["A.", "B."], "req-1") == 2
        assert await store.remember("t1", "ann", ["B.", "C."], "req-2") == 1
        assert await store.remember("t2", "ann", ["A."], "req-3") == 1
        first = await store.recall("t1", "ann", 2)
        rest = await store.recall("t1", "ann", 2, first.next_after)
        assert sorted(r.content for r in [*first.rows, *rest.rows]) == ["A.", "B.", "C."]
        assert rest.next_after == ""
        with pytest.raises(NotFound):
            await store.forget("t2", memory_id=first.rows[0].id)
        with pytest.raises(NotFound, match="about user 'bob'"):
            await store.forget("t1", memory_id=first.rows[0].id, user="bob")
        assert await store.forget("t1", memory_id=first.rows[0].id, user="ann") == 1
        assert await store.forget("t1", user="ann") == 2
        assert (await store.recall("t1", "ann", 10)).rows == []
        assert [r.content for r in (await store.recall("t2", "ann", 10)).rows] == ["A."]
    finally:
        db.dispose()


async def test_a_user_keeps_the_newest_facts(zone_url: str) -> None:
    db = await VectorStoreDb.open(zone_url, "us-east")
    store = MemoryStore(db)
    try:
        await asyncio.to_thread(store.create_schema)
        for n in range(5):
            await store.remember("t1", "bob", [f"fact {n}."], f"req-{n}", most=3)
        kept = (await store.recall("t1", "bob", 10)).rows
        assert [r.content for r in kept] == ["fact 4.", "fact 3.", "fact 2."]
    finally:
        db.dispose()
