"""A vector store's file batches, kept with its files in the zone's store.

A batch is a row naming its store and one row per file it added. The files'
states are not copied: they are the files' memberships of the store
(``retrieval_vector_store_files``), so a batch's counts and files are those
of its files still in the store, as they are now. Removing a file from the
store, deleting the file or the store drops it from its batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import NotFound
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_queries import MEMBER_COLUMNS, member_page, store_row
from llmmesh.region.knowledge.vector_store_rows import FileBatchRow, FileCounts, Page, VectorStoreFileRow
from llmmesh.region.knowledge.vector_store_schema import file_batch_files, file_batches, vector_store_files

FILE_BATCH_NOT_FOUND = "VECTOR_STORE_FILE_BATCH_NOT_FOUND"


class FileBatchStore:
    """File batches in the tables of ``db``; every read and write names the
    tenant and the store, so another tenant's batch, or one of another
    store, is ``NOT_FOUND`` like a missing one."""

    def __init__(self, db: VectorStoreDb) -> None:
        self._db = db

    async def record(
        self, tenant_id: str, store_id: str, batch_id: str, file_ids: Sequence[str], created_at: datetime
    ) -> FileBatchRow:
        """Record a batch of the files ``file_ids`` already added to the tenant's store."""

        def write(conn: Connection) -> FileBatchRow:
            store_row(conn, tenant_id, store_id)
            home = {"tenant_id": tenant_id, "home_region": self._db.region, "vector_store_id": store_id}
            conn.execute(sa.insert(file_batches).values(id=batch_id, created_at=created_at, **home))
            conn.execute(
                sa.insert(file_batch_files),
                [{"batch_id": batch_id, "file_id": file_id, **home} for file_id in file_ids],
            )
            return _batch(conn, tenant_id, store_id, batch_id)

        return await self._db.transaction(write)

    async def get(self, tenant_id: str, store_id: str, batch_id: str) -> FileBatchRow:
        return await self._db.transaction(lambda conn: _batch(conn, tenant_id, store_id, batch_id))

    async def files(
        self, tenant_id: str, store_id: str, batch_id: str, status: str, limit: int, after: str
    ) -> Page[VectorStoreFileRow]:
        """A page of the batch's files in the store, newest first; only those
        in ``status`` when it is not empty."""

        def read(conn: Connection) -> Page[VectorStoreFileRow]:
            _batch(conn, tenant_id, store_id, batch_id)
            vsf, fbf = vector_store_files, file_batch_files
            query = (
                sa.select(*MEMBER_COLUMNS)
                .join(
                    fbf,
                    sa.and_(fbf.c.vector_store_id == vsf.c.vector_store_id, fbf.c.file_id == vsf.c.file_id),
                )
                .where(fbf.c.batch_id == batch_id, vsf.c.vector_store_id == store_id)
            )
            if status:
                query = query.where(vsf.c.status == status)
            return member_page(conn, store_id, query, limit, after)

        return await self._db.transaction(read)


def _batch(conn: Connection, tenant_id: str, store_id: str, batch_id: str) -> FileBatchRow:
    """The tenant's batch of the store with its files' counts; NOT_FOUND when the
    store is not the tenant's or the batch not the store's."""
    store_row(conn, tenant_id, store_id)
    fb = file_batches
    created = conn.execute(
        sa.select(fb.c.created_at).where(
            fb.c.id == batch_id, fb.c.tenant_id == tenant_id, fb.c.vector_store_id == store_id
        )
    ).scalar_one_or_none()
    if created is None:
        raise NotFound(
            FILE_BATCH_NOT_FOUND,
            f"no file batch {batch_id!r} in vector store {store_id!r}",
            metadata={"param": "batch_id"},
        )
    vsf, fbf = vector_store_files, file_batch_files
    counted = conn.execute(
        sa.select(vsf.c.status, sa.func.count())
        .select_from(fbf)
        .join(vsf, sa.and_(vsf.c.vector_store_id == fbf.c.vector_store_id, vsf.c.file_id == fbf.c.file_id))
        .where(fbf.c.batch_id == batch_id)
        .group_by(vsf.c.status)
    ).all()
    by_status = {status: int(n) for status, n in counted}
    return FileBatchRow(
        batch_id,
        store_id,
        created,
        FileCounts(by_status.get("completed", 0), by_status.get("failed", 0)),
    )
