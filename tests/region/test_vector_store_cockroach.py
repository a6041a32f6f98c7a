"""A region's retrieval and memory on a CockroachDB zone store, where no
CockroachDB server runs: the test PostgreSQL answers as CockroachDB
(``tests/region/cockroach_emulation.py``), so the region's code goes out
through the cockroachdb dialect and psycopg's CockroachDB connection.

Every statement it sends is checked against CockroachDB's recorded syntax
(``tests/cockroachdb_syntax.py``). Without emulation, what
only CockroachDB takes fails at the database with the database's own
error; the operator's check script (``scripts/check-cockroachdb.py``) runs
its whole path on the emulation."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.crdb import CrdbConnection

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.region.knowledge.vector_store_text import chunk_text, query_terms
from tests.cockroachdb_syntax import fold, problems
from tests.region.cockroach_emulation import Cockroach, cockroach_url
from tests.region.test_vector_store import DIMS, FACTS, embed

pytestmark = [pytest.mark.asyncio, pytest.mark.services]
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-cockroachdb.py"


@pytest.fixture
def emulated(postgres_url: str) -> Iterator[Cockroach]:
    with cockroach_url(postgres_url, emulate=True) as cockroach:
        yield cockroach


async def _every_path(db: VectorStoreDb) -> None:
    """Each operation of the files, vector stores, search and memory APIs, once."""
    store = await db.create_vector_store("t1", "vs_us_1", "facts", {"k": "v"})
    for n, (name, text) in enumerate(FACTS.items()):
        await db.create_file("t1", f"file-us-{n}", name, "assistants", text.encode())
        pieces = [(c, embed(c)) for c in chunk_text(text, 200, 20)]
        await db.add_file("t1", store.id, f"file-us-{n}", pieces, (200, 20))
    await db.add_file("t1", store.id, "file-us-0", [], (200, 20), error="refused")
    assert (await db.file_content("t1", "file-us-1"))[1] == FACTS["tokyo.txt"].encode()
    assert len((await db.list_files("t1", "assistants", 2, "")).rows) == 2
    assert len((await db.list_vector_stores("t1", 10, "")).rows) == 1
    assert (await db.get_member("t1", store.id, "file-us-2")).status == "completed"
    query = "What is the capital of Japan?"
    hits = await db.search("t1", [store.id], embed(query), query_terms(query), 3)
    assert hits[0].filename == "tokyo.txt"
    await db.remove_file("t1", store.id, "file-us-2")
    await db.delete_file("t1", "file-us-1")
    await db.delete_vector_store("t1", store.id)
    memory = MemoryStore(db)
    await asyncio.to_thread(memory.create_schema)
    assert await memory.remember("t1", "ann", ["A.", "B."], "req-1") == 2
    first = await memory.recall("t1", "ann", 1)
    await memory.recall("t1", "ann", 1, first.next_after)
    assert await memory.forget("t1", memory_id=first.rows[0].id) == 1
    assert await memory.forget("t1", user="ann") == 1


async def test_every_statement_of_retrieval_and_memory_is_cockroachdb_syntax(emulated: Cockroach) -> None:
    db = await VectorStoreDb.open(emulated.url, "us-east", dimensions=DIMS)
    try:
        assert (db.engine.dialect.name, db.engine.dialect.driver, db.index.name) == (
            "cockroachdb",
            "psycopg",
            "cockroachdb",
        )
        with db.engine.connect() as conn:
            driver_connection: object = conn.connection.dbapi_connection
            assert isinstance(driver_connection, CrdbConnection)
        await _every_path(db)
    finally:
        db.dispose()
    ours = {fold(s) for s in emulated.sent if "retrieval_" in s or "user_memories" in s}
    assert {s[:100]: problems(s) for s in ours} == {s[:100]: [] for s in ours}
    # The paths were all taken: each table made, each kind of statement sent.
    made = {s.split()[5] for s in ours if s.startswith("CREATE TABLE IF NOT EXISTS")}
    assert made == {t.name for t in RETRIEVAL_TABLES}
    for sent in (
        "INSERT INTO retrieval_chunks",
        "AS VECTOR)",
        "ORDER BY embedding <=> CAST(",
        "text_search @@ to_tsquery('english',",
        "ts_rank(text_search,",
        "DELETE FROM retrieval_chunks",
        "CREATE TABLE user_memories",
        "ON CONFLICT DO NOTHING RETURNING user_memories.id",
        "DELETE FROM user_memories",
    ):
        assert any(sent in s for s in ours), sent


async def test_what_only_cockroachdb_takes_fails_at_the_database(postgres_url: str) -> None:
    with cockroach_url(postgres_url) as cockroach:
        with pytest.raises(sa.exc.ProgrammingError) as caught:
            await VectorStoreDb.open(cockroach.url, "us-east")
        # PostgreSQL reads the index CockroachDB declares inside CREATE TABLE as a column "index".
        assert isinstance(caught.value.orig, psycopg.errors.UndefinedObject)
        assert 'type "ix_retrieval_files_tenant_created" does not exist' in str(caught.value.orig)
        assert str(caught.value.statement).startswith("CREATE TABLE IF NOT EXISTS retrieval_files")
        # Memory uses nothing only CockroachDB takes: it runs whole through the cockroachdb dialect.
        db = VectorStoreDb(create_store_engine(cockroach.url), "us-east")
        try:
            memory = MemoryStore(db)
            await asyncio.to_thread(memory.create_schema)
            assert await memory.remember("t1", "ann", ["A.", "B."], "req-1") == 2
            assert await memory.remember("t1", "ann", ["B."], "req-2") == 0
            assert sorted(r.content for r in (await memory.recall("t1", "ann", 10)).rows) == ["A.", "B."]
            assert await memory.forget("t1", user="ann") == 2
        finally:
            db.dispose()
        assert any(s.startswith("INSERT INTO user_memories") for s in cockroach.sent)


async def test_a_vector_of_another_width_is_refused_or_finds_nothing(emulated: Cockroach) -> None:
    db = await VectorStoreDb.open(emulated.url, "us-east", dimensions=DIMS)
    try:
        store = await db.create_vector_store("t1", "vs_us_1", "facts", {})
        await db.create_file("t1", "file-us-0", "tokyo.txt", "assistants", FACTS["tokyo.txt"].encode())
        text = FACTS["tokyo.txt"]
        with pytest.raises(ValueError, match=r"32-component embedding for a VECTOR\(64\) column"):
            await db.add_file("t1", store.id, "file-us-0", [(text, embed(text)[:32])], (200, 20))
        await db.add_file("t1", store.id, "file-us-0", [(text, embed(text))], (200, 20))
        assert await db.search("t1", [store.id], embed(text)[:32], [], 3) == []
    finally:
        db.dispose()
    with pytest.raises(
        ValueError, match="keeps 64-component embeddings but retrieval_embedding_dimensions is 32"
    ):
        await VectorStoreDb.open(emulated.url, "us-east", dimensions=32)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_cockroachdb", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_operators_check_runs_the_regions_path(emulated: Cockroach, postgres_url: str) -> None:
    script = _script()
    checks = {c.name: c for c in await script.retrieval_checks(emulated.url, 32)}
    assert list(checks) == [
        "retrieval tables",
        "writes",
        "hybrid search",
        "vector search",
        "full-text search",
        "vector index",
        "inverted index",
        "memory",
    ]
    assert {c.status for c in checks.values()} == {"ok"}, [c.line() for c in checks.values()]
    server = {c.name: c for c in await asyncio.to_thread(script.server_checks, emulated.url)}
    assert server["release"].status == "ok"
    # PostgreSQL has no cluster settings: reported, not a failure.
    assert server["feature.vector_index.enabled"].status == "WARN"
    with cockroach_url(postgres_url, release="v25.2.3") as older:
        [release, _] = await asyncio.to_thread(script.server_checks, older.url)
    assert release.status == "FAILED" and "need v25.4" in release.detail
    with pytest.raises(SystemExit):
        script.main(["postgresql+psycopg://postgres@127.0.0.1:5432/test"])
