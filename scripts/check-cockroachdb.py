"""Check a CockroachDB cluster for the region's retrieval and memory: the
tables, the vector and full-text searches, and the indexes that serve them.

Usage::

    .venv/bin/python scripts/check-cockroachdb.py URL [--dimensions 256] [--keep]

with URL a SQLAlchemy URL of the cluster, as the zone store's, e.g.
``cockroachdb+psycopg://USER@HOST:26257/defaultdb?sslmode=verify-full&sslrootcert=…``.

It creates a scratch database (``llmmesh_check_<random>``: the user needs
``CREATEDB``), and in it runs what a region runs on a CockroachDB zone
store: the retrieval tables' DDL
(``llmmesh/region/knowledge/vector_store_ddl.py``, embeddings of
``--dimensions`` components, the embedding model's width), a vector store
with three files, a hybrid search, each search alone, each forced onto its
index (``table@index``: CockroachDB refuses a query the hinted index cannot
serve) and the end-user memory table. Then it drops the database, unless
``--keep``. One line per check, ``ok``, ``WARN`` or ``FAILED`` with
CockroachDB's own error; the exit status is 1 when any check failed.

Vector indexes need CockroachDB v25.4 or later (``vector_cosine_ops``) and,
where the cluster still has it off, ``SET CLUSTER SETTING
feature.vector_index.enabled = true`` (the check reports the setting; an
admin sets it once per cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_cockroach import MATCHING_SQL, NEAREST_SQL, CockroachIndex
from llmmesh.region.knowledge.vector_store_ddl import (
    DEFAULT_DIMENSIONS,
    MIN_VERSION,
    TEXT_INDEX,
    VECTOR_INDEX,
)
from llmmesh.region.knowledge.vector_store_postgres import tsquery_text
from llmmesh.region.knowledge.vector_store_schema import chunks, vector_text
from llmmesh.region.knowledge.vector_store_text import query_terms

FACTS = {
    "paris.txt": "The capital of France is Paris. Paris hosts the Louvre museum.",
    "tokyo.txt": "Tokyo is the capital of Japan and its largest city.",
    "rust.txt": "Rust is a systems programming language with ownership and borrowing.",
}
QUESTION = "What is the capital of Japan?"
ANSWER = "tokyo.txt"
TENANT = "llmmesh-check"
_PLAN_INDEX = re.compile(r"table: \S+@\S+|vector search|inverted")
"""The lines of a CockroachDB plan that say which index a search reads."""


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``ok``, ``WARN`` or ``FAILED``, and what was seen."""

    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:6} {self.name}: {' '.join(self.detail.split())}"


def embed(text: str, dimensions: int) -> list[float]:
    """A bag of hashed words, L2-normalised: texts sharing words point alike."""
    vector = [0.0] * dimensions
    for word in query_terms(text):
        digest = hashlib.sha256(word.encode()).digest()
        vector[int.from_bytes(digest[:4], "big") % dimensions] += 1.0 if digest[4] % 2 else -1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def server_checks(url: str) -> list[Check]:
    """The server's release against :data:`MIN_VERSION`, and the vector index setting."""
    engine = create_store_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            banner = str(conn.exec_driver_sql("SELECT version()").scalar())
            try:
                enabled = str(
                    conn.exec_driver_sql("SHOW CLUSTER SETTING feature.vector_index.enabled").scalar()
                )
            except sa.exc.DBAPIError as err:
                enabled = f"not readable here: {err.orig}"
    finally:
        engine.dispose()
    found = re.search(r"\bv(\d+)\.(\d+)", banner)
    release = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    wanted = f"v{MIN_VERSION[0]}.{MIN_VERSION[1]}"
    checks = [
        Check("ok", "release", banner)
        if release >= MIN_VERSION
        else Check("FAILED", "release", f"{banner}: vector indexes with vector_cosine_ops need {wanted}")
    ]
    if enabled.lower() in ("true", "t"):
        checks.append(Check("ok", "feature.vector_index.enabled", enabled))
    elif enabled.startswith("not readable"):
        checks.append(Check("WARN", "feature.vector_index.enabled", enabled))
    else:
        fix = "an admin runs SET CLUSTER SETTING feature.vector_index.enabled = true"
        checks.append(Check("FAILED", "feature.vector_index.enabled", f"{enabled}: {fix}"))
    return checks


async def retrieval_checks(url: str, dimensions: int) -> list[Check]:
    """The region's own path on the (empty) database at ``url``: its DDL,
    writes, searches, each search forced onto its index, and memory."""
    try:
        db = await VectorStoreDb.open(url, "llmmesh-check", dimensions=dimensions)
    except sa.exc.DBAPIError as err:
        return [Check("FAILED", "retrieval tables", f"{err.orig}")]
    checks = [Check("ok", "retrieval tables", f"created with VECTOR({dimensions}) embeddings")]
    try:
        store = await db.create_vector_store(TENANT, f"vs_check_{secrets.token_hex(4)}", "check", {})
        for n, (name, text) in enumerate(FACTS.items()):
            file_id = f"file-check-{n}"
            await db.create_file(TENANT, file_id, name, "assistants", text.encode())
            await db.add_file(TENANT, store.id, file_id, [(text, embed(text, dimensions))], (800, 200))
        checks.append(Check("ok", "writes", f"{len(FACTS)} files chunked into store {store.id}"))
        hits = await db.search(TENANT, [store.id], embed(QUESTION, dimensions), query_terms(QUESTION), 3)
        top = hits[0].filename if hits else "nothing"
        status = "ok" if top == ANSWER else "FAILED"
        checks.append(Check(status, "hybrid search", f"{QUESTION!r} -> {top}, want {ANSWER}"))
        checks += await asyncio.to_thread(_index_checks, db, store.id)
        checks += await _memory_checks(db)
    except sa.exc.DBAPIError as err:
        checks.append(Check("FAILED", "retrieval", f"{err.orig}"))
    finally:
        db.dispose()
    return checks


def _index_checks(db: VectorStoreDb, store_id: str) -> list[Check]:
    """Each search alone, then forced onto its index: CockroachDB refuses to
    plan a query whose hinted index cannot serve it."""
    index = db.index
    assert isinstance(index, CockroachIndex)
    vector, terms = embed(QUESTION, index.dimensions), query_terms(QUESTION)
    searches = (
        ("vector index", NEAREST_SQL, VECTOR_INDEX, vector_text(vector)),
        ("inverted index", MATCHING_SQL, TEXT_INDEX, tsquery_text(terms)),
    )
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        answer = conn.execute(
            sa.select(chunks.c.id).where(chunks.c.tenant_id == TENANT, chunks.c.file_id == "file-check-1")
        ).scalar_one()
        checks = [
            _expect(
                "vector search", [c for c, _ in index.nearest(conn, TENANT, [store_id], vector, 3)], answer
            ),
            _expect("full-text search", index.matching(conn, TENANT, [store_id], terms, 3), answer),
        ]
        for name, sql, index_name, query in searches:
            hinted = sa.text(sql.replace(f"FROM {chunks.name} ", f"FROM {chunks.name}@{index_name} ", 1))
            values = {"q": query, "tenant": TENANT, "store": store_id, "k": 3}
            # Literal values (this script's own digits, words and ids): EXPLAIN takes no placeholders.
            explain = "EXPLAIN " + str(
                hinted.bindparams(**values).compile(conn, compile_kwargs={"literal_binds": True})
            )
            try:
                plan = [str(line).strip() for line in conn.exec_driver_sql(explain).scalars()]
            except sa.exc.DBAPIError as err:
                checks.append(Check("FAILED", name, f"cannot serve its search: {err.orig}"))
                continue
            shown = " / ".join(line for line in plan if _PLAN_INDEX.search(line))
            checks.append(Check("ok", name, f"serves its search ({shown or 'planned'})"))
    return checks


def _expect(name: str, ranked: Sequence[int], answer: int) -> Check:
    return Check(
        "ok" if ranked[:1] == [answer] else "FAILED", name, f"chunks {list(ranked)}, want {answer} first"
    )


async def _memory_checks(db: VectorStoreDb) -> list[Check]:
    memory = MemoryStore(db)
    await asyncio.to_thread(memory.create_schema)
    kept = await memory.remember(TENANT, "user", ["Prefers metric units.", "Lives in Lyon."], "check")
    again = await memory.remember(TENANT, "user", ["Lives in Lyon."], "check")
    recalled = len((await memory.recall(TENANT, "user", 10)).rows)
    forgotten = await memory.forget(TENANT, user="user")
    ok = (kept, again, recalled, forgotten) == (2, 0, 2, 2)
    return [
        Check(
            "ok" if ok else "FAILED",
            "memory",
            f"kept {kept}, kept again {again}, recalled {recalled}, forgot {forgotten}",
        )
    ]


def run(url: str, dimensions: int, keep: bool, say: Callable[[str], None] = print) -> int:
    """Every check, in a scratch database of the cluster at ``url``; 1 when any failed."""
    scratch = f"llmmesh_check_{secrets.token_hex(4)}"
    engine = create_store_engine(url)
    try:
        checks = server_checks(url)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {scratch}")
        say(f"scratch database {scratch}")
        try:
            scratch_url = engine.url.set(database=scratch).render_as_string(hide_password=False)
            checks += asyncio.run(retrieval_checks(scratch_url, dimensions))
        finally:
            if not keep:
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.exec_driver_sql(f"DROP DATABASE {scratch} CASCADE")
    except sa.exc.DBAPIError as err:
        checks = [Check("FAILED", "cluster", f"{err.orig}")]
    finally:
        engine.dispose()
    for check in checks:
        say(check.line())
    return 1 if any(check.status == "FAILED" for check in checks) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("url", help="SQLAlchemy URL of the cluster (cockroachdb+psycopg://…)")
    parser.add_argument(
        "--dimensions", type=int, default=DEFAULT_DIMENSIONS, help="the embedding model's width"
    )
    parser.add_argument("--keep", action="store_true", help="leave the scratch database for inspection")
    args = parser.parse_args(argv)
    if sa.make_url(args.url).get_backend_name() != "cockroachdb":
        parser.error("the URL must be a CockroachDB one: cockroachdb+psycopg://…")
    return run(args.url, args.dimensions, args.keep)


if __name__ == "__main__":
    sys.exit(main())
