"""The search contract every engine under a zone's vector stores keeps,
run on each (an SQLite file with sqlite-vec and FTS5; PostgreSQL with
full-text search and exact scoring; CockroachDB's SQL with its vector and
inverted indexes, emulated on PostgreSQL: ``tests/region/cockroach_emulation.py``):
files, stores, memberships, tenant isolation and hybrid search, and the
two rankings each engine gives (best first, only the named stores, only
chunks of the query's width, any of the query's words)."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from llmmesh.core.errors import NotFound
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_text import chunk_text, query_terms
from tests.region.cockroach_emulation import RETRIEVAL_ENGINES, retrieval_url

pytestmark = pytest.mark.asyncio
DIMS = 64


@pytest.fixture(params=RETRIEVAL_ENGINES)
def zone_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The zone store's URL on each engine retrieval runs on."""
    with retrieval_url(request, tmp_path) as url:
        yield url


@pytest_asyncio.fixture
async def db(zone_url: str) -> AsyncIterator[VectorStoreDb]:
    """The zone's retrieval tables, for embeddings of ``DIMS`` components."""
    opened = await VectorStoreDb.open(zone_url, "us-east", dimensions=DIMS)
    yield opened
    opened.dispose()


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


async def test_hybrid_search_finds_the_chunk_that_answers(db: VectorStoreDb) -> None:
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


async def test_another_tenant_sees_nothing(db: VectorStoreDb) -> None:
    store_id = await _loaded(db)
    with pytest.raises(NotFound) as caught:
        await db.search("t2", [store_id], embed("Tokyo"), ["tokyo"], 3)
    assert caught.value.reason == "VECTOR_STORE_NOT_FOUND"
    with pytest.raises(NotFound):
        await db.get_file("t2", "file-us-0")
    assert (await db.list_files("t2", "", 10, "")).rows == []


async def test_deleting_a_file_removes_its_chunks_from_search(db: VectorStoreDb) -> None:
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


async def _chunk_ids(db: VectorStoreDb, tenant: str = "t1") -> dict[str, int]:
    """The one chunk of each file, by file name."""
    by_name: dict[str, int] = {}
    for store in (await db.list_vector_stores(tenant, 10, "")).rows:
        query = "capital city language"
        for hit in await db.search(tenant, [store.id], embed(query), query_terms(query), 10):
            by_name[hit.filename] = hit.chunk_id
    return by_name


async def test_the_vector_ranking_is_best_first_in_the_named_stores_and_the_querys_width(
    db: VectorStoreDb,
) -> None:
    store_id = await _loaded(db)
    other = await db.create_vector_store("t1", "vs_us_2", "more", {})
    await db.create_file("t1", "file-us-9", "kyoto.txt", "assistants", b"Kyoto was the capital of Japan.")
    text = "Kyoto was the capital of Japan."
    await db.add_file("t1", other.id, "file-us-9", [(text, embed(text))], (200, 20))
    ids = await _chunk_ids(db)
    query = embed("What is the capital of Japan?")

    def rank(stores: list[str], vector: list[float]) -> list[tuple[int, float]]:
        return db.run_transaction(lambda conn: db.index.nearest(conn, "t1", stores, vector, 10))

    ranked = await asyncio.to_thread(rank, [store_id], query)
    assert [chunk for chunk, _ in ranked][:1] == [ids["tokyo.txt"]]
    assert {chunk for chunk, _ in ranked} == {ids["paris.txt"], ids["tokyo.txt"], ids["rust.txt"]}
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    tokyo = embed(FACTS["tokyo.txt"])
    assert ranked[0][1] == pytest.approx(sum(a * b for a, b in zip(query, tokyo, strict=True)), abs=1e-4)
    both = await asyncio.to_thread(rank, [store_id, other.id], query)
    assert ids["kyoto.txt"] in {chunk for chunk, _ in both} and len(both) == 4
    assert await asyncio.to_thread(rank, [store_id], [*query, 0.0]) == []
    assert await asyncio.to_thread(rank, [], query) == []


async def test_the_text_ranking_takes_any_of_the_words_in_the_named_stores(db: VectorStoreDb) -> None:
    store_id = await _loaded(db)
    ids = await _chunk_ids(db)

    def rank(tenant: str, terms: list[str]) -> list[int]:
        return db.run_transaction(lambda conn: db.index.matching(conn, tenant, [store_id], terms, 10))

    assert await asyncio.to_thread(rank, "t1", ["japan"]) == [ids["tokyo.txt"]]
    assert set(await asyncio.to_thread(rank, "t1", ["tokyo", "ownership"])) == {
        ids["tokyo.txt"],
        ids["rust.txt"],
    }
    # Stemmed or not, "capital" ranks the chunks that say it, and nothing else.
    assert set(await asyncio.to_thread(rank, "t1", ["capital"])) == {ids["paris.txt"], ids["tokyo.txt"]}
    assert await asyncio.to_thread(rank, "t1", ["zebra"]) == []
    assert await asyncio.to_thread(rank, "t1", []) == []
    assert await asyncio.to_thread(rank, "t2", ["japan"]) == []
