"""The region's settings for files, vector stores, retrieval and memory
(a mixin of :class:`region.settings.RegionSettings`)."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.core.config import setting

MAX_STORES_PER_SEARCH = 10
"""Vector stores one search (or one chat turn) may name."""


@dataclass(frozen=True)
class RetrievalSettings:
    """How files are chunked and embedded, and how much a tenant may upload."""

    retrieval_embedding_model: str = setting(
        "llmmesh-tiny-embed", "embedding model that embeds file chunks and search queries"
    )
    retrieval_embedding_dimensions: int = setting(
        256, "components of that model's embeddings: the width of a CockroachDB zone store's VECTOR column"
    )
    retrieval_chunk_chars: int = setting(800, "characters per file chunk unless a request says otherwise")
    retrieval_chunk_overlap_chars: int = setting(
        200, "characters consecutive chunks share unless a request says otherwise"
    )
    retrieval_max_file_bytes: int = setting(4 * 1024 * 1024, "largest file a tenant may upload")
    retrieval_max_files: int = setting(
        10_000, "most files a tenant keeps in the zone, unless its policy names its own (max_files)"
    )
    retrieval_max_vector_stores: int = setting(
        1_000,
        "most vector stores a tenant keeps in the zone, unless its policy names its own (max_vector_stores)",
    )
    retrieval_context_results: int = setting(5, "chunks a chat turn naming vector stores gets in its context")
