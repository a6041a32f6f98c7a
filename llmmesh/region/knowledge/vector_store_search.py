"""Hybrid search in one transaction: the index's vector ranking and
full-text ranking of a query's chunks, fused by reciprocal rank
(:mod:`region.knowledge.vector_store_text`), with each chunk's file and text."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.region.knowledge.chunk_index import ChunkIndex
from llmmesh.region.knowledge.vector_store_rows import ChunkHit
from llmmesh.region.knowledge.vector_store_schema import chunks, files
from llmmesh.region.knowledge.vector_store_text import reciprocal_rank_fusion

CANDIDATES_PER_RANKING = 50
"""Chunks each ranking contributes to the fusion: a generous multiple of the results asked."""


def hybrid_search(
    conn: Connection,
    index: ChunkIndex,
    tenant_id: str,
    store_ids: Sequence[str],
    vector: Sequence[float],
    terms: Sequence[str],
    limit: int,
) -> list[ChunkHit]:
    """The ``limit`` best chunks of ``store_ids`` (the tenant's, checked by
    the caller) for a query's embedding and words, best first."""
    depth = max(CANDIDATES_PER_RANKING, limit)
    nearest = index.nearest(conn, tenant_id, store_ids, vector, depth)
    similarity = dict(nearest)
    matched = index.matching(conn, tenant_id, store_ids, terms, depth)
    fused = reciprocal_rank_fusion([c for c, _ in nearest], matched)[:limit]
    if not fused:
        return []
    rows = conn.execute(
        sa.select(
            chunks.c.id,
            chunks.c.vector_store_id,
            chunks.c.file_id,
            files.c.filename,
            chunks.c.chunk_index,
            chunks.c.text,
        )
        .join(files, files.c.id == chunks.c.file_id)
        .where(chunks.c.tenant_id == tenant_id, chunks.c.id.in_([f.chunk_id for f in fused]))
    ).all()
    by_id = {int(r[0]): r for r in rows}
    return [
        ChunkHit(
            f.chunk_id,
            str(by_id[f.chunk_id][1]),
            str(by_id[f.chunk_id][2]),
            str(by_id[f.chunk_id][3]),
            int(by_id[f.chunk_id][4]),
            str(by_id[f.chunk_id][5]),
            f.score,
            similarity.get(f.chunk_id, 0.0),
            f.text_rank,
        )
        for f in fused
        if f.chunk_id in by_id
    ]
