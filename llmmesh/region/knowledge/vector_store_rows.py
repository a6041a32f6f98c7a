"""What the vector store database hands out: files, vector stores, their
memberships and search hits, as plain frozen rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

T = TypeVar("T")

FILE_NOT_FOUND = "FILE_NOT_FOUND"
VECTOR_STORE_NOT_FOUND = "VECTOR_STORE_NOT_FOUND"
VECTOR_STORE_FILE_NOT_FOUND = "VECTOR_STORE_FILE_NOT_FOUND"


@dataclass(frozen=True)
class FileRow:
    """An uploaded file, without its bytes."""

    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: datetime


@dataclass(frozen=True)
class FileCounts:
    """A vector store's files by state."""

    completed: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True)
class VectorStoreRow:
    """A vector store with what it holds."""

    id: str
    name: str
    metadata: dict[str, str]
    created_at: datetime
    last_active_at: datetime
    counts: FileCounts = field(default_factory=FileCounts)
    usage_bytes: int = 0


@dataclass(frozen=True)
class VectorStoreFileRow:
    """A file's membership in a vector store."""

    vector_store_id: str
    file_id: str
    status: str
    usage_bytes: int
    last_error: str
    max_chunk_chars: int
    chunk_overlap_chars: int
    chunks: int
    created_at: datetime


@dataclass(frozen=True)
class FileBatchRow:
    """A file batch of a vector store with its files' states."""

    id: str
    vector_store_id: str
    created_at: datetime
    counts: FileCounts

    @property
    def status(self) -> str:
        """Files are added before a batch is recorded, so it is always finished."""
        return "completed"


@dataclass(frozen=True)
class ChunkHit:
    """A chunk a search found."""

    chunk_id: int
    vector_store_id: str
    file_id: str
    filename: str
    chunk_index: int
    text: str
    score: float
    vector_score: float
    text_rank: int


@dataclass(frozen=True)
class Page(Generic[T]):
    """A page of rows, newest first, and the id to continue after (empty on the last page)."""

    rows: list[T]
    next_after: str
