"""CockroachDB DDL of the retrieval tables: ``VECTOR`` embeddings under a
vector index, a stored ``tsvector`` under an inverted index, and residency
as the conversation tables have it (:mod:`region.zone_store.ddl`): each row
``REGIONAL BY ROW`` in the database region its ``home_region`` maps to,
inside the zone's super region.

Statements for an operator or a migration to run after the zone tables'
(``zone_residency_statements`` makes the super regions). The region's
search on CockroachDB would rank by ``embedding <=> $query`` (cosine
distance, served by the vector index) and ``text_search @@ to_tsquery(…)``
(the inverted index); the runtime engines today are SQLite and PostgreSQL
(:mod:`region.vector_store_index`), and this DDL is checked by compilation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.types import UserDefinedType

from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES, chunks
from llmmesh.region.zone_store.ddl import REGION_COLUMN, ZoneRegion, _cockroach, _home_region_case, _zones


class Vector(UserDefinedType[Any]):
    """CockroachDB's ``VECTOR(n)``."""

    cache_ok = True

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions

    def get_col_spec(self, **kw: Any) -> str:
        return f"VECTOR({self.dimensions})"


def _tables(dimensions: int) -> list[sa.Table]:
    """The retrieval tables with the chunks' embedding as ``VECTOR(dimensions)``."""
    metadata = sa.MetaData()
    tables = []
    for table in RETRIEVAL_TABLES:
        copy = table.to_metadata(metadata)
        if table is chunks:
            copy.c.embedding.type = Vector(dimensions)
        tables.append(copy)
    return tables


def create_table_statements(dimensions: int = 256, dialect: Dialect | None = None) -> list[str]:
    """``CREATE TABLE`` and indexes of the retrieval tables for CockroachDB,
    embeddings of ``dimensions`` components (the embedding model's width)."""
    if dimensions < 1:
        raise ValueError("dimensions must be positive")
    dialect = _cockroach(dialect)
    statements: list[str] = []
    for table in _tables(dimensions):
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        statements.extend(str(CreateIndex(index).compile(dialect=dialect)).strip() for index in table.indexes)
    name = chunks.name
    statements += [
        f"ALTER TABLE {name} ADD COLUMN text_search TSVECTOR AS (to_tsvector('english', text)) STORED",
        f"CREATE INVERTED INDEX ix_{name}_text ON {name} (tenant_id, vector_store_id, text_search)",
        f"CREATE VECTOR INDEX ix_{name}_embedding ON {name} "
        "(tenant_id, vector_store_id, embedding vector_cosine_ops)",
    ]
    return statements


def residency_statements(regions: Sequence[ZoneRegion], dialect: Dialect | None = None) -> list[str]:
    """Every retrieval table ``REGIONAL BY ROW`` by its ``home_region``; a
    region the mapping does not know computes NULL, which the column refuses.
    ValueError for the malformed mappings the zone DDL refuses."""
    _zones(regions)
    dialect = _cockroach(dialect)
    prep = dialect.identifier_preparer
    home = _home_region_case(regions, dialect)
    column = prep.quote(REGION_COLUMN)
    statements: list[str] = []
    for table in RETRIEVAL_TABLES:
        quoted = prep.format_table(table)
        statements.append(
            f"ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS {column} crdb_internal_region NOT NULL "
            f"AS ({home}) STORED"
        )
        statements.append(f"ALTER TABLE {quoted} SET LOCALITY REGIONAL BY ROW AS {column}")
    return statements
