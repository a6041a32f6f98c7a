"""CockroachDB DDL of the retrieval tables: ``VECTOR`` embeddings under a
vector index, a stored ``tsvector`` under an inverted index, and residency
as the conversation tables have it (:mod:`region.zone_store.ddl`): each row
``REGIONAL BY ROW`` in the database region its ``home_region`` maps to,
inside the zone's super region.

:func:`create_table_statements` is one ``CREATE TABLE IF NOT EXISTS`` per
table with its indexes declared inline, so a table is made whole or not at
all and running them again changes nothing: the region runs them when its
zone store is CockroachDB (:class:`region.knowledge.vector_store_cockroach.CockroachIndex`),
and an operator may run them first. Declared with the table, the vector
index is built on an empty table; ``CREATE VECTOR INDEX`` on a table with
rows blocks its writes while it builds and is refused under
``sql_safe_updates``. :func:`residency_statements` follow the zone tables'
(``zone_residency_statements`` makes the super regions).

The chunks' vector index has the ``vector_cosine_ops`` operator class, so
it serves ``ORDER BY embedding <=> $query`` (cosine distance); that class
is in CockroachDB from v25.4 (v25.2 and v25.3 accelerate only L2 distance,
``<->``), hence :data:`MIN_VERSION`. Where the cluster setting
``feature.vector_index.enabled`` is off, CockroachDB refuses the chunks
table (``scripts/check-cockroachdb.py`` reports the setting).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateTable

from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES, Vector, chunks
from llmmesh.region.zone_store.ddl import REGION_COLUMN, ZoneRegion, _cockroach, _home_region_case, _zones

MIN_VERSION = (25, 4)
"""The first CockroachDB release whose vector indexes take ``vector_cosine_ops``."""

DEFAULT_DIMENSIONS = 256
"""The simulator's embedding width, and ``retrieval_embedding_dimensions``' default."""

TEXT_SEARCH_COLUMN = "text_search"
"""The chunks' stored ``tsvector``, under the inverted index."""

TEXT_SEARCH_CONFIG = "english"
"""The text search configuration of documents and queries alike."""

VECTOR_INDEX = f"ix_{chunks.name}_embedding"
"""The chunks' vector index: (tenant, store, embedding by cosine distance)."""

TEXT_INDEX = f"ix_{chunks.name}_text"
"""The chunks' inverted index: (tenant, store, stored tsvector)."""

_PREFIX = ("tenant_id", "vector_store_id")
"""The inverted and vector indexes' prefix columns: a search names one tenant's store."""


def _tables(dimensions: int) -> list[sa.Table]:
    """The retrieval tables with the chunks' embedding as ``VECTOR(dimensions)``
    and their stored ``tsvector``."""
    metadata = sa.MetaData()
    tables = []
    for table in RETRIEVAL_TABLES:
        copy = table.to_metadata(metadata)
        if table is chunks:
            copy.c.embedding.type = Vector(dimensions)
            copy.append_column(
                sa.Column(
                    TEXT_SEARCH_COLUMN,
                    postgresql.TSVECTOR,
                    sa.Computed(f"to_tsvector('{TEXT_SEARCH_CONFIG}', text)", persisted=True),
                )
            )
        tables.append(copy)
    return tables


def _inline_indexes(table: sa.Table, dialect: Dialect) -> list[str]:
    """The table's indexes as ``CREATE TABLE`` declares them."""
    prep = dialect.identifier_preparer
    declared = [
        f"INDEX {prep.quote(str(index.name))} ({', '.join(prep.quote(c.name) for c in index.columns)})"
        for index in sorted(table.indexes, key=lambda index: str(index.name))
    ]
    if table.name == chunks.name:
        prefix = ", ".join(prep.quote(c) for c in _PREFIX)
        declared += [
            f"INVERTED INDEX {TEXT_INDEX} ({prefix}, {TEXT_SEARCH_COLUMN})",
            f"VECTOR INDEX {VECTOR_INDEX} ({prefix}, embedding vector_cosine_ops)",
        ]
    return declared


def create_table_statements(
    dimensions: int = DEFAULT_DIMENSIONS, dialect: Dialect | None = None
) -> list[str]:
    """``CREATE TABLE IF NOT EXISTS`` of each retrieval table for CockroachDB,
    its indexes declared inline, embeddings of ``dimensions`` components
    (the embedding model's width)."""
    if dimensions < 1:
        raise ValueError("dimensions must be positive")
    dialect = _cockroach(dialect)
    statements: list[str] = []
    for table in _tables(dimensions):
        create = str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip()
        body = create.removesuffix(")").rstrip()
        statements.append(",\n\t".join([body, *_inline_indexes(table, dialect)]) + "\n)")
    return statements


def residency_statements(
    regions: Sequence[ZoneRegion],
    dialect: Dialect | None = None,
    tables: Sequence[sa.Table] = RETRIEVAL_TABLES,
) -> list[str]:
    """Every retrieval table (or each of ``tables``, which have a
    ``home_region``) ``REGIONAL BY ROW`` by its ``home_region``; a region the
    mapping does not know computes NULL, which the column refuses.
    ValueError for the malformed mappings the zone DDL refuses."""
    _zones(regions)
    dialect = _cockroach(dialect)
    prep = dialect.identifier_preparer
    home = _home_region_case(regions, dialect)
    column = prep.quote(REGION_COLUMN)
    statements: list[str] = []
    for table in tables:
        quoted = prep.format_table(table)
        statements.append(
            f"ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS {column} crdb_internal_region NOT NULL "
            f"AS ({home}) STORED"
        )
        statements.append(f"ALTER TABLE {quoted} SET LOCALITY REGIONAL BY ROW AS {column}")
    return statements
