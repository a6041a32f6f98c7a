"""The retrieval rows as ``RetrievalService`` messages."""

from __future__ import annotations

from datetime import datetime

from llmmesh.region.knowledge.vector_store_rows import (
    ChunkHit,
    FileBatchRow,
    FileCounts,
    FileRow,
    VectorStoreFileRow,
    VectorStoreRow,
)
from llmmesh.v1 import retrieval_service_pb2 as pb


def _seconds(moment: datetime) -> int:
    return int(moment.timestamp())


def file_proto(row: FileRow) -> pb.StoredFile:
    return pb.StoredFile(
        id=row.id,
        filename=row.filename,
        purpose=row.purpose,
        bytes=row.bytes,
        created_at=_seconds(row.created_at),
    )


def _counts(counts: FileCounts) -> pb.VectorStoreFileCounts:
    return pb.VectorStoreFileCounts(completed=counts.completed, failed=counts.failed, total=counts.total)


def store_proto(row: VectorStoreRow) -> pb.VectorStore:
    return pb.VectorStore(
        id=row.id,
        name=row.name,
        created_at=_seconds(row.created_at),
        file_counts=_counts(row.counts),
        usage_bytes=row.usage_bytes,
        # Files are chunked and embedded before an answer, so a store is never half-built.
        status="completed",
        last_active_at=_seconds(row.last_active_at),
        metadata=row.metadata,
    )


def member_proto(row: VectorStoreFileRow) -> pb.VectorStoreFile:
    return pb.VectorStoreFile(
        file_id=row.file_id,
        vector_store_id=row.vector_store_id,
        created_at=_seconds(row.created_at),
        status=row.status,
        usage_bytes=row.usage_bytes,
        last_error=row.last_error,
        max_chunk_chars=row.max_chunk_chars,
        chunk_overlap_chars=row.chunk_overlap_chars,
        chunks=row.chunks,
    )


def batch_proto(row: FileBatchRow) -> pb.VectorStoreFileBatch:
    return pb.VectorStoreFileBatch(
        id=row.id,
        vector_store_id=row.vector_store_id,
        created_at=_seconds(row.created_at),
        status=row.status,
        file_counts=_counts(row.counts),
    )


def hit_proto(hit: ChunkHit) -> pb.SearchResult:
    return pb.SearchResult(
        file_id=hit.file_id,
        filename=hit.filename,
        vector_store_id=hit.vector_store_id,
        chunk_index=hit.chunk_index,
        text=hit.text,
        score=hit.score,
        vector_score=hit.vector_score,
        text_rank=hit.text_rank,
    )
