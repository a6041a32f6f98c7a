"""What a search engine under a zone's vector stores is to the rest of the
region: the tables it keeps them in, the chunks it takes and the searches
it answers. The engines, one per database kind (SQLite, PostgreSQL,
CockroachDB), are in :mod:`region.knowledge.vector_store_index`,
:mod:`region.knowledge.vector_store_postgres` and
:mod:`region.knowledge.vector_store_cockroach`; every one answers the same
searches (``tests/region/test_vector_store.py`` runs the contract on each)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Connection


@dataclass(frozen=True)
class IndexedChunk:
    """A chunk as the index takes it."""

    chunk_id: int
    vector_store_id: str
    text: str
    vector: Sequence[float]


class ChunkIndex(Protocol):
    """Vector and full-text search over the chunks table of one database."""

    name: str

    def create_tables(self, conn: Connection) -> None:
        """Create the retrieval tables that are missing, as this database keeps them."""

    def setup(self, conn: Connection) -> None:
        """Create, or check, what the index needs beside the tables."""

    def encode(self, vector: Sequence[float]) -> Any:
        """A vector as the chunks table's ``embedding`` column holds it."""

    def add(self, conn: Connection, items: Sequence[IndexedChunk]) -> None:
        """Index chunks just inserted."""

    def remove(self, conn: Connection, chunk_ids: Sequence[int], dimensions: int) -> None:
        """Forget chunks about to be deleted."""

    def nearest(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], vector: Sequence[float], k: int
    ) -> list[tuple[int, float]]:
        """The ``k`` chunks of ``store_ids`` most similar to ``vector``, of
        its width only: (chunk id, cosine similarity), best first."""

    def matching(
        self, conn: Connection, tenant_id: str, store_ids: Sequence[str], terms: Sequence[str], k: int
    ) -> list[int]:
        """The ``k`` chunks full-text search ranks best for any of ``terms``, best first."""
