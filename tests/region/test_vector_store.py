"""The zone's vector store database on real engines (an SQLite file with
sqlite-vec and FTS5; PostgreSQL with full-text search and exact scoring):
files, stores, memberships, tenant isolation and hybrid search."""

from __future__ import annotations

import hashlib
import math

import pytest

from llmmesh.core.errors import NotFound
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_text import chunk_text, query_terms

pytestmark = pytest.mark.asyncio
DIMS = 64


def embed(text: str) -> list[float]:
    """A bag of hashed words, L2-normalised: similar words, similar vectors."""
    vector = [0.0] * DIMS
    for word in query_terms(text):
        digest = hashlib.sha256(word.encode()).digest()
        vector[digest[0] % DIMS] += 1.0 if digest[1] % 2 else -1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


FACTS = {
    "paris.txt": "The capital of France is Paris. Paris hosts the Louvre museum.",
    "tokyo.txt": "Tokyo is the capital of Japan and its largest city.",
    "rust.txt": "Rust is a systems programming language with ownership and borrowing.",
}


async def _loaded(db: VectorStoreDb, tenant: str = "t1") -> str:
    store = await db.create_vector_store(tenant, "vs_us_1", "facts", {"k": "v"})
    for n, (name, text) in enumerate(FACTS.items()):
        await db.create_file(tenant, f"file-us-{n}", name, "assistants", text.encode())
        pieces = [(c, embed(c)) for c in chunk_text(text, 200, 20)]
        await db.add_file(tenant, store.id, f"file-us-{n}", pieces, (200, 20))
    return store.id


async def test_hybrid_search_finds_the_chunk_that_answers(zone_url: str) -> None:
    db = await VectorStoreDb.open(zone_url, "us-east")
    try:
        store_id = await _loaded(db)
        query = "What is the capital of Japan?"
        hits = await db.search("t1", [store_id], embed(query), query_terms(query), 3)
        assert hits[0].filename == "tokyo.txt"
        assert hits[0].text_rank == 1 and hits[0].vector_score > 0.3
        assert 0 < hits[0].score <= 1.0 and [h.score for h in hits] == sorted(
            (h.score for h in hits), reverse=True
        )
        row = await db.get_vector_store("t1", store_id)
        assert row.counts.completed == 3 and row.usage_bytes == sum(len(t) for t in FACTS.values())
        assert row.metadata == {"k": "v"}
    finally:
        db.dispose()


async def test_another_tenant_sees_nothing(zone_url: str) -> None:
    db = await VectorStoreDb.open(zone_url, "us-east")
    try:
        store_id = await _loaded(db)
        with pytest.raises(NotFound) as caught:
            await db.search("t2", [store_id], embed("Tokyo"), ["tokyo"], 3)
        assert caught.value.reason == "VECTOR_STORE_NOT_FOUND"
        with pytest.raises(NotFound):
            await db.get_file("t2", "file-us-0")
        assert (await db.list_files("t2", "", 10, "")).rows == []
    finally:
        db.dispose()


async def test_deleting_a_file_removes_its_chunks_from_search(zone_url: str) -> None:
    db = await VectorStoreDb.open(zone_url, "us-east")
    try:
        store_id = await _loaded(db)
        await db.delete_file("t1", "file-us-1")
        hits = await db.search("t1", [store_id], embed("capital of Japan"), ["tokyo", "japan"], 5)
        assert hits and all(h.file_id != "file-us-1" for h in hits)
        page = await db.list_files_of("t1", store_id, 1, "")
        assert len(page.rows) == 1 and page.next_after
        rest = await db.list_files_of("t1", store_id, 10, page.next_after)
        assert {r.file_id for r in [*page.rows, *rest.rows]} == {"file-us-0", "file-us-2"}
        await db.delete_vector_store("t1", store_id)
        with pytest.raises(NotFound):
            await db.get_vector_store("t1", store_id)
    finally:
        db.dispose()
