"""The row lookups the vector store database's transactions share: a
tenant's file, vector store or membership (NOT_FOUND when the tenant has
none of that id), keyset paging, and a store's last activity."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import NotFound
from llmmesh.region.knowledge.vector_store_rows import (
    FILE_NOT_FOUND,
    VECTOR_STORE_FILE_NOT_FOUND,
    VECTOR_STORE_NOT_FOUND,
    FileCounts,
    FileRow,
    Page,
    VectorStoreFileRow,
    VectorStoreRow,
)
from llmmesh.region.knowledge.vector_store_schema import files, vector_store_files, vector_stores

FILE_COLUMNS = (files.c.id, files.c.filename, files.c.purpose, files.c.bytes, files.c.created_at)
MEMBER_COLUMNS = (
    vector_store_files.c.vector_store_id,
    vector_store_files.c.file_id,
    vector_store_files.c.status,
    vector_store_files.c.usage_bytes,
    vector_store_files.c.last_error,
    vector_store_files.c.max_chunk_chars,
    vector_store_files.c.chunk_overlap_chars,
    vector_store_files.c.chunks,
    vector_store_files.c.created_at,
)


def before(table: sa.Table, created_at: datetime, row_id: str) -> sa.ColumnElement[bool]:
    """Rows after (created_at, id) in newest-first order."""
    return sa.or_(
        table.c.created_at < created_at, sa.and_(table.c.created_at == created_at, table.c.id < row_id)
    )


def file_row(conn: Connection, tenant_id: str, file_id: str) -> FileRow:
    row = conn.execute(
        sa.select(*FILE_COLUMNS).where(files.c.id == file_id, files.c.tenant_id == tenant_id)
    ).first()
    if row is None:
        raise NotFound(FILE_NOT_FOUND, f"no file {file_id!r}", metadata={"param": "file_id"})
    return FileRow(*row)


def store_row(conn: Connection, tenant_id: str, store_id: str) -> VectorStoreRow:
    vs = vector_stores
    row = conn.execute(sa.select(vs).where(vs.c.id == store_id, vs.c.tenant_id == tenant_id)).first()
    if row is None:
        raise NotFound(
            VECTOR_STORE_NOT_FOUND, f"no vector store {store_id!r}", metadata={"param": "vector_store_id"}
        )
    vsf = vector_store_files
    counts = conn.execute(
        sa.select(vsf.c.status, sa.func.count(), sa.func.coalesce(sa.func.sum(vsf.c.usage_bytes), 0))
        .where(vsf.c.vector_store_id == store_id)
        .group_by(vsf.c.status)
    ).all()
    by_status = {status: (int(n), int(used)) for status, n, used in counts}
    return VectorStoreRow(
        row.id,
        row.name,
        json.loads(row.metadata_json),
        row.created_at,
        row.last_active_at,
        FileCounts(by_status.get("completed", (0, 0))[0], by_status.get("failed", (0, 0))[0]),
        sum(used for _, used in by_status.values()),
    )


def member_row(conn: Connection, store_id: str, file_id: str) -> VectorStoreFileRow:
    vsf = vector_store_files
    row = conn.execute(
        sa.select(*MEMBER_COLUMNS).where(vsf.c.vector_store_id == store_id, vsf.c.file_id == file_id)
    ).first()
    if row is None:
        raise NotFound(
            VECTOR_STORE_FILE_NOT_FOUND,
            f"file {file_id!r} is not in vector store {store_id!r}",
            metadata={"param": "file_id"},
        )
    return VectorStoreFileRow(*row)


def member_page(
    conn: Connection, store_id: str, query: sa.Select[Any], limit: int, after: str
) -> Page[VectorStoreFileRow]:
    """One page of ``query``'s files of the store (it selects
    :data:`MEMBER_COLUMNS`), newest first, after the file ``after``."""
    vsf = vector_store_files
    if after:
        last = member_row(conn, store_id, after)
        query = query.where(
            sa.or_(
                vsf.c.created_at < last.created_at,
                sa.and_(vsf.c.created_at == last.created_at, vsf.c.file_id < last.file_id),
            )
        )
    rows = conn.execute(query.order_by(vsf.c.created_at.desc(), vsf.c.file_id.desc()).limit(limit + 1))
    found = [VectorStoreFileRow(*r) for r in rows]
    return Page(found[:limit], found[limit - 1].file_id if len(found) > limit else "")


def touch(conn: Connection, store_id: str, now: datetime) -> None:
    conn.execute(sa.update(vector_stores).where(vector_stores.c.id == store_id).values(last_active_at=now))
