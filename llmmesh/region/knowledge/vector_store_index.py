"""The search engines under a zone's vector stores, one per database kind.

- **SQLite** (embedded): sqlite-vec's ``vec0`` virtual table (one per vector
  width, the vector store id its partition key, cosine distance) for
  k-nearest-neighbour search, and an FTS5 table for BM25 full-text search.
  The standard library's ``sqlite3`` here cannot load extensions, so these
  connections come from ``pysqlite3``, which links its own SQLite library.
  Two SQLite libraries in one process must never open the same file (each
  keeps its own POSIX lock table, so one's close drops the other's locks
  and commits are lost), so the retrieval tables live in a file of their
  own beside the zone store's (:func:`retrieval_database_url`): the same
  zone, the same place, another file.
- **PostgreSQL** (tests; pgvector is not installed on this machine kind):
  full-text search on ``to_tsvector('english', text)`` under a GIN index,
  ranked by ``ts_rank_cd``, and exact vector scoring of ``real[]`` columns
  (the dot product of L2-normalised vectors, their cosine) over the
  searched stores' chunks: a brute-force scan, exact by construction.
- **CockroachDB** (production): ``VECTOR`` columns of the embedding
  model's width under a vector index (cosine distance) and a stored
  ``tsvector`` under an inverted index, in the tables of
  :mod:`region.knowledge.vector_store_ddl`
  (:mod:`region.knowledge.vector_store_cockroach`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from llmmesh.core.sqlstore import _prepare_sqlite, create_store_engine
from llmmesh.region.knowledge.chunk_index import ChunkIndex, IndexedChunk
from llmmesh.region.knowledge.vector_store_cockroach import CockroachIndex
from llmmesh.region.knowledge.vector_store_ddl import DEFAULT_DIMENSIONS
from llmmesh.region.knowledge.vector_store_postgres import PostgresIndex
from llmmesh.region.knowledge.vector_store_schema import chunks, metadata


def float32_bytes(vector: Sequence[float]) -> bytes:
    """Little-endian float32, as sqlite-vec reads vectors."""
    return struct.pack(f"<{len(vector)}f", *vector)


def retrieval_database_url(zone_store_url: str) -> str:
    """Where the retrieval tables of the zone store at ``zone_store_url``
    live: the same database, except for an SQLite file, whose tables go to
    ``NAME.retrieval.db`` beside it (see the module's note)."""
    parsed = sa.make_url(zone_store_url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return zone_store_url
    path = Path(database)
    return parsed.set(database=str(path.with_name(f"{path.stem}.retrieval.db"))).render_as_string(
        hide_password=False
    )


def open_retrieval_engine(zone_store_url: str) -> Engine:
    """An engine on the retrieval tables of the zone store at
    ``zone_store_url``: on SQLite through ``pysqlite3`` with sqlite-vec
    loaded (an in-memory ``sqlite://`` is a database of its own); elsewhere
    the zone store's own kind of engine on its database."""
    url = retrieval_database_url(zone_store_url)
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_store_engine(url)
    import pysqlite3.dbapi2 as dbapi  # type: ignore[import-untyped]
    import sqlite_vec  # type: ignore[import-untyped]

    database = parsed.database or ""
    memory = database in ("", ":memory:")
    options: dict[str, Any] = {"module": dbapi, "connect_args": {"check_same_thread": False}}
    if memory:
        options["poolclass"] = StaticPool
    else:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(parsed, **options)

    @sa.event.listens_for(engine, "connect")
    def _load_vec(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.enable_load_extension(True)
        sqlite_vec.load(dbapi_conn)
        dbapi_conn.enable_load_extension(False)

    # The zone store's pragmas and BEGIN IMMEDIATE, for the same file.
    _prepare_sqlite(engine, file_backed=not memory)
    return engine


def index_for(engine: Engine, dimensions: int = DEFAULT_DIMENSIONS) -> ChunkIndex:
    """The search engine of ``engine``'s database, for embeddings of
    ``dimensions`` components where the database fixes a width
    (CockroachDB); ValueError for a database retrieval does not run on."""
    kind = engine.dialect.name
    if kind == "sqlite":
        return SqliteVecIndex()
    if kind == "postgresql":
        return PostgresIndex()
    if kind == "cockroachdb":
        return CockroachIndex(dimensions)
    raise ValueError(f"retrieval runs on SQLite (sqlite-vec), PostgreSQL and CockroachDB, not on {kind}")


_FTS = "retrieval_chunk_text"


def _vec_table(dimensions: int) -> str:
    return f"retrieval_vec_{int(dimensions)}"


class SqliteVecIndex:
    """sqlite-vec ``vec0`` k-NN and FTS5 BM25, keyed by the chunk's id."""

    name = "sqlite-vec+fts5"

    def create_tables(self, conn: Connection) -> None:
        metadata.create_all(conn)

    def setup(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"CREATE VIRTUAL TABLE IF NOT EXISTS {_FTS} USING fts5(text)")

    def encode(self, vector: Sequence[float]) -> Any:
        return float32_bytes(vector)

    def _ensure_vec(self, conn: Connection, dimensions: int) -> str:
        table = _vec_table(dimensions)
        conn.exec_driver_sql(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING vec0("
            f"vector_store_id text partition key, embedding float[{int(dimensions)}] distance_metric=cosine)"
        )
        return table

    def add(self, conn: Connection, items: Sequence[IndexedChunk]) -> None:
        for item in items:
            table = self._ensure_vec(conn, len(item.vector))
            conn.exec_driver_sql(
                f"INSERT INTO {table}(rowid, vector_store_id, embedding) VALUES (?, ?, ?)",
                (item.chunk_id, item.vector_store_id, float32_bytes(item.vector)),
            )
            conn.exec_driver_sql(f"INSERT INTO {_FTS}(rowid, text) VALUES (?, ?)", (item.chunk_id, item.text))

    def remove(self, conn: Connection, chunk_ids: Sequence[int], dimensions: int) -> None:
        table = self._ensure_vec(conn, dimensions)
        for chunk_id in chunk_ids:
            conn.exec_driver_sql(f"DELETE FROM {table} WHERE rowid = ?", (chunk_id,))
            conn.exec_driver_sql(f"DELETE FROM {_FTS} WHERE rowid = ?", (chunk_id,))

    def nearest(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], vector: Sequence[float], k: int
    ) -> list[tuple[int, float]]:
        # The stores were checked to be the tenant's; the partition key keeps
        # each search inside one store.
        table = self._ensure_vec(conn, len(vector))
        query = float32_bytes(vector)
        found: list[tuple[int, float]] = []
        for store_id in store_ids:
            rows = conn.exec_driver_sql(
                f"SELECT rowid, distance FROM {table} "
                "WHERE embedding MATCH ? AND k = ? AND vector_store_id = ?",
                (query, k, store_id),
            ).all()
            found.extend((int(rowid), 1.0 - float(distance)) for rowid, distance in rows)
        found.sort(key=lambda hit: -hit[1])
        return found[:k]

    def matching(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], terms: Sequence[str], k: int
    ) -> list[int]:
        if not terms or not store_ids:
            return []
        # Each term quoted (FTS5 syntax in a user's words is not obeyed), any term matching.
        expression = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        marks = ", ".join("?" for _ in store_ids)
        # The full-text matches first, once (materialized), then their chunks
        # by primary key: a join the planner drives from the chunks table
        # would run the MATCH once per chunk.
        rows = conn.exec_driver_sql(
            f"WITH hits AS MATERIALIZED (SELECT rowid AS id, bm25({_FTS}) AS rank FROM {_FTS} "
            f"WHERE {_FTS} MATCH ?) "
            f"SELECT c.id FROM hits JOIN {chunks.name} AS c ON c.id = hits.id "
            f"WHERE c.tenant_id = ? AND c.vector_store_id IN ({marks}) ORDER BY hits.rank, c.id LIMIT ?",
            (expression, tenant_id, *store_ids, k),
        ).all()
        return [int(row[0]) for row in rows]
