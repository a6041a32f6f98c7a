"""Retrieval on PostgreSQL without pgvector: full-text search under a GIN
index on ``to_tsvector('english', text)``, ranked by ``ts_rank_cd``, and
exact cosine scoring of ``real[]`` embeddings (a scan of the searched
stores' chunks; every chunk is scored, so the vector ranking is exact)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.region.knowledge.chunk_index import IndexedChunk
from llmmesh.region.knowledge.vector_store_schema import chunks, metadata

_TSV = "to_tsvector('english', text)"


def tsquery_text(terms: Sequence[str]) -> str:
    """A ``to_tsquery`` text matching any of ``terms``: each word its own
    lexeme (``plainto_tsquery`` would need them all); terms that are not
    plain words are dropped, so no tsquery syntax in a user's words is
    obeyed. Empty when no term is left."""
    return " | ".join(term for term in terms if term.isalnum())


class PostgresIndex:
    """Full-text and exact vector search in plain PostgreSQL."""

    name = "postgresql"

    def create_tables(self, conn: Connection) -> None:
        metadata.create_all(conn)

    def setup(self, conn: Connection) -> None:
        conn.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS ix_retrieval_chunks_text ON {chunks.name} USING gin ({_TSV})"
        )

    def encode(self, vector: Sequence[float]) -> Any:
        return [float(x) for x in vector]

    def add(self, conn: Connection, items: Sequence[IndexedChunk]) -> None:
        """Nothing beside the row: the GIN index follows the table."""

    def remove(self, conn: Connection, chunk_ids: Sequence[int], dimensions: int) -> None:
        """Nothing beside the row."""

    def nearest(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], vector: Sequence[float], k: int
    ) -> list[tuple[int, float]]:
        if not store_ids:
            return []
        rows = conn.execute(
            sa.text(
                f"SELECT id, (SELECT sum(a * b) FROM unnest(embedding, CAST(:q AS real[])) AS t(a, b)) AS s "
                f"FROM {chunks.name} WHERE tenant_id = :tenant AND vector_store_id = ANY(:stores) "
                "AND dimensions = :dims ORDER BY s DESC, id LIMIT :k"
            ),
            {
                "q": [float(x) for x in vector],
                "tenant": tenant_id,
                "stores": list(store_ids),
                "dims": len(vector),
                "k": k,
            },
        ).all()
        return [(int(row[0]), float(row[1])) for row in rows]

    def matching(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], terms: Sequence[str], k: int
    ) -> list[int]:
        query = tsquery_text(terms)
        if not query or not store_ids:
            return []
        rows = conn.execute(
            sa.text(
                f"SELECT id FROM {chunks.name}, to_tsquery('english', :q) AS query "
                f"WHERE tenant_id = :tenant AND vector_store_id = ANY(:stores) AND {_TSV} @@ query "
                f"ORDER BY ts_rank_cd({_TSV}, query) DESC, id LIMIT :k"
            ),
            {"q": query, "tenant": tenant_id, "stores": list(store_ids), "k": k},
        ).all()
        return [int(row[0]) for row in rows]
