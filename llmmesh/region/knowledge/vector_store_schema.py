"""The tables of a zone's files, vector stores and chunks: tenant content,
kept with the zone store and nowhere else.

Every row carries ``home_region`` (the region that wrote it), from which a
multi-region CockroachDB computes its ``crdb_region`` as it does for the
conversation tables (:mod:`region.knowledge.vector_store_ddl`). A chunk's embedding is
float32 little-endian bytes on SQLite (the layout sqlite-vec reads), a
``real[]`` on PostgreSQL and a :class:`Vector` on CockroachDB, whose
tables come from the DDL module (their ``VECTOR`` has the embedding
model's width, which an index needs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import UserDefinedType

from llmmesh.core.sqlstore import UtcDateTime


def vector_text(vector: Sequence[float]) -> str:
    """A vector as CockroachDB (and pgvector) read one: ``[x,y,…]``, each
    component to float32's nine significant digits."""
    return "[" + ",".join(format(float(x), ".9g") for x in vector) + "]"


class Vector(UserDefinedType[list[float]]):
    """CockroachDB's ``VECTOR``, ``VECTOR(n)`` with a width. A value is
    bound as its text cast to ``VECTOR`` (psycopg has no vector adapter)
    and read back as a list of floats."""

    cache_ok = True

    def __init__(self, dimensions: int | None = None) -> None:
        self.dimensions = dimensions

    def get_col_spec(self, **kw: Any) -> str:
        return "VECTOR" if self.dimensions is None else f"VECTOR({self.dimensions})"

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any]:
        return lambda value: None if value is None else vector_text(value)

    def bind_expression(self, bindvalue: Any) -> Any:
        return sa.cast(bindvalue, Vector())

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any]:
        def parse(value: Any) -> list[float] | None:
            if value is None:
                return None
            inner = str(value).strip().removeprefix("[").removesuffix("]")
            return [float(x) for x in inner.split(",")] if inner.strip() else []

        return parse


metadata = sa.MetaData()

files = sa.Table(
    "retrieval_files",
    metadata,
    # "file-<zone>-<random>": the id names the zone holding it.
    sa.Column("id", sa.String(96), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("filename", sa.String(512), nullable=False),
    sa.Column("purpose", sa.String(32), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("content", sa.LargeBinary, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_retrieval_files_tenant_created", "tenant_id", "created_at", "id"),
)

vector_stores = sa.Table(
    "retrieval_vector_stores",
    metadata,
    # "vs_<zone>_<random>".
    sa.Column("id", sa.String(96), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("name", sa.String(256), nullable=False),
    # The creation's metadata as a JSON object of strings.
    sa.Column("metadata_json", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("last_active_at", UtcDateTime, nullable=False),
    sa.Index("ix_retrieval_vector_stores_tenant_created", "tenant_id", "created_at", "id"),
)

vector_store_files = sa.Table(
    "retrieval_vector_store_files",
    metadata,
    sa.Column("vector_store_id", sa.String(96), primary_key=True),
    sa.Column("file_id", sa.String(96), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    # "completed" or "failed".
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("usage_bytes", sa.BigInteger, nullable=False),
    sa.Column("last_error", sa.Text, nullable=False),
    sa.Column("max_chunk_chars", sa.Integer, nullable=False),
    sa.Column("chunk_overlap_chars", sa.Integer, nullable=False),
    sa.Column("chunks", sa.Integer, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

file_batches = sa.Table(
    "retrieval_file_batches",
    metadata,
    # "vsfb_<zone>_<random>".
    sa.Column("id", sa.String(96), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("vector_store_id", sa.String(96), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_retrieval_file_batches_store", "tenant_id", "vector_store_id"),
)

# The files each batch added; a file's state is its row of vector_store_files.
file_batch_files = sa.Table(
    "retrieval_file_batch_files",
    metadata,
    sa.Column("batch_id", sa.String(96), primary_key=True),
    sa.Column("file_id", sa.String(96), primary_key=True),
    sa.Column("vector_store_id", sa.String(96), nullable=False),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Index("ix_retrieval_file_batch_files_member", "tenant_id", "vector_store_id", "file_id"),
)

chunks = sa.Table(
    "retrieval_chunks",
    metadata,
    # The rowid of the chunk's entries in the SQLite vector and full-text indexes.
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("vector_store_id", sa.String(96), nullable=False),
    sa.Column("file_id", sa.String(96), nullable=False),
    sa.Column("chunk_index", sa.Integer, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("dimensions", sa.Integer, nullable=False),
    sa.Column(
        "embedding",
        sa.LargeBinary()
        .with_variant(postgresql.ARRAY(sa.REAL), "postgresql")
        .with_variant(Vector(), "cockroachdb"),
        nullable=False,
    ),
    sa.Index("ix_retrieval_chunks_store", "tenant_id", "vector_store_id", "file_id"),
)

RETRIEVAL_TABLES = (files, vector_stores, vector_store_files, file_batches, file_batch_files, chunks)
"""Homed row by row, as the conversation tables are."""
