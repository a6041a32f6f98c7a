"""Retrieval on CockroachDB: the tables of
:mod:`region.knowledge.vector_store_ddl`, k-nearest-neighbour search by
cosine distance (``<=>``) under the chunks' vector index, and full-text
search with ``@@`` under the inverted index of their stored ``tsvector``,
ranked by ``ts_rank`` (CockroachDB has no ``ts_rank_cd``).

Both indexes lead with (tenant, vector store), and CockroachDB uses such
an index only when every prefix column is constrained to one value, so each
searched store is one query and the answers are merged, as the SQLite
engine's per-store ``vec0`` partitions are. The vector index is
approximate: a search visits ``vector_search_beam_size`` partitions per
level of its tree (a session setting, 32 by default) rather than every
vector, trading recall for speed as the other engines do not.

A ``VECTOR`` column has one width, the embedding model's
(``retrieval_embedding_dimensions``); chunks of another width are refused,
and a query of another width finds nothing, as on the other engines a
query meets only chunks of its own width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.region.knowledge.chunk_index import IndexedChunk
from llmmesh.region.knowledge.vector_store_ddl import (
    TEXT_SEARCH_COLUMN,
    TEXT_SEARCH_CONFIG,
    create_table_statements,
)
from llmmesh.region.knowledge.vector_store_postgres import tsquery_text
from llmmesh.region.knowledge.vector_store_schema import chunks, vector_text

NEAREST_SQL = (
    f"SELECT id, 1 - (embedding <=> CAST(:q AS VECTOR)) AS similarity FROM {chunks.name} "
    "WHERE tenant_id = :tenant AND vector_store_id = :store "
    "ORDER BY embedding <=> CAST(:q AS VECTOR) LIMIT :k"
)
"""One store's ``k`` chunks nearest ``q`` (a vector's text), in the shape the vector index serves."""

MATCHING_SQL = (
    f"SELECT id, ts_rank({TEXT_SEARCH_COLUMN}, to_tsquery('{TEXT_SEARCH_CONFIG}', :q)) AS rank "
    f"FROM {chunks.name} WHERE tenant_id = :tenant AND vector_store_id = :store "
    f"AND {TEXT_SEARCH_COLUMN} @@ to_tsquery('{TEXT_SEARCH_CONFIG}', :q) ORDER BY rank DESC, id LIMIT :k"
)
"""One store's ``k`` chunks best ranked for the tsquery text ``q``, in the shape the inverted index serves."""

_NEAREST = sa.text(NEAREST_SQL)
_MATCHING = sa.text(MATCHING_SQL)


class CockroachIndex:
    """Vector and full-text search on CockroachDB's own indexes, for
    embeddings of ``dimensions`` components."""

    name = "cockroachdb"

    def __init__(self, dimensions: int) -> None:
        if dimensions < 1:
            raise ValueError("the embedding width must be positive")
        self.dimensions = dimensions

    def create_tables(self, conn: Connection) -> None:
        for statement in create_table_statements(self.dimensions, conn.dialect):
            conn.exec_driver_sql(statement)

    def setup(self, conn: Connection) -> None:
        """Check that the chunks already kept have this index's width (the
        column holds one, so one chunk tells): ValueError naming the setting
        when they do not."""
        kept = conn.execute(sa.select(chunks.c.dimensions).limit(1)).scalar_one_or_none()
        if kept is not None and kept != self.dimensions:
            raise ValueError(
                f"the zone store keeps {kept}-component embeddings but retrieval_embedding_dimensions "
                f"is {self.dimensions}: set it to the embedding model's width"
            )

    def encode(self, vector: Sequence[float]) -> Any:
        if len(vector) != self.dimensions:
            raise ValueError(
                f"a {len(vector)}-component embedding for a VECTOR({self.dimensions}) column: "
                "set retrieval_embedding_dimensions to the embedding model's width"
            )
        return [float(x) for x in vector]

    def add(self, conn: Connection, items: Sequence[IndexedChunk]) -> None:
        """Nothing beside the row: both indexes follow the table."""

    def remove(self, conn: Connection, chunk_ids: Sequence[int], dimensions: int) -> None:
        """Nothing beside the row."""

    def nearest(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], vector: Sequence[float], k: int
    ) -> list[tuple[int, float]]:
        if len(vector) != self.dimensions:
            return []
        query = vector_text(vector)
        found: list[tuple[int, float]] = []
        for store_id in store_ids:
            rows = conn.execute(_NEAREST, {"q": query, "tenant": tenant_id, "store": store_id, "k": k})
            found.extend((int(chunk_id), float(similarity)) for chunk_id, similarity in rows)
        found.sort(key=lambda hit: (-hit[1], hit[0]))
        return found[:k]

    def matching(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], terms: Sequence[str], k: int
    ) -> list[int]:
        query = tsquery_text(terms)
        if not query:
            return []
        ranked: list[tuple[float, int]] = []
        for store_id in store_ids:
            rows = conn.execute(_MATCHING, {"q": query, "tenant": tenant_id, "store": store_id, "k": k})
            ranked.extend((float(rank), int(chunk_id)) for chunk_id, rank in rows)
        ranked.sort(key=lambda hit: (-hit[0], hit[1]))
        return [chunk_id for _, chunk_id in ranked[:k]]
