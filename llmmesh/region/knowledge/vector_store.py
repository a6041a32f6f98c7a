"""A zone's files, vector stores and chunks, kept with the zone store (its
database, or on SQLite a file beside it: :mod:`region.knowledge.vector_store_index`).

Every read and write names the tenant: another tenant's file or vector store
is ``NOT_FOUND`` like a missing one. A file's chunks and their index entries
are written in one transaction with its membership, so a search never sees
half a file. Hybrid search ranks a query's chunks twice (vector similarity
and full-text) and fuses the rankings by reciprocal rank
(:mod:`region.knowledge.vector_store_text`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llmmesh.core.errors import FailedPrecondition, Reason
from llmmesh.core.sqlstore import SqlStore
from llmmesh.region.knowledge.chunk_index import ChunkIndex, IndexedChunk
from llmmesh.region.knowledge.vector_store_ddl import DEFAULT_DIMENSIONS
from llmmesh.region.knowledge.vector_store_index import index_for, open_retrieval_engine
from llmmesh.region.knowledge.vector_store_queries import (
    FILE_COLUMNS,
    MEMBER_COLUMNS,
    before,
    file_row,
    member_page,
    member_row,
    store_row,
    touch,
)
from llmmesh.region.knowledge.vector_store_rows import (
    ChunkHit,
    FileRow,
    Page,
    VectorStoreFileRow,
    VectorStoreRow,
)
from llmmesh.region.knowledge.vector_store_schema import (
    chunks,
    file_batch_files,
    file_batches,
    files,
    vector_store_files,
    vector_stores,
)
from llmmesh.region.knowledge.vector_store_search import hybrid_search

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class VectorStoreDb(SqlStore):
    """The retrieval tables of one zone, written by region ``region``, for
    embeddings of ``dimensions`` components where the database fixes a
    width (CockroachDB's ``VECTOR`` columns)."""

    store_label = "retrieval"

    def __init__(
        self, engine: Engine, region: str, *, clock: Clock = _now, dimensions: int = DEFAULT_DIMENSIONS
    ) -> None:
        super().__init__(engine)
        self.region = region
        self.index: ChunkIndex = index_for(engine, dimensions)
        self._clock = clock

    @classmethod
    async def open(
        cls, url: str, region: str, *, clock: Clock = _now, dimensions: int = DEFAULT_DIMENSIONS
    ) -> VectorStoreDb:
        """Connect to the zone store's database ``url`` and create what is
        missing; when that fails, its error, with the connections closed."""
        db = cls(open_retrieval_engine(url), region, clock=clock, dimensions=dimensions)
        try:
            await asyncio.to_thread(db.create_schema)
        except BaseException:
            db.dispose()
            raise
        return db

    def now(self) -> datetime:
        """The time by the database's clock."""
        return self._clock()

    def create_schema(self) -> None:
        self.run_transaction(self.index.create_tables)
        self.run_transaction(self.index.setup)

    # ------------------------------------------------------------------ files

    async def create_file(
        self, tenant_id: str, file_id: str, filename: str, purpose: str, content: bytes, most: int = 0
    ) -> FileRow:
        """Store a file of the tenant's; with ``most``, refused (FAILED_PRECONDITION,
        ``param`` ``file``) when the tenant keeps that many in the zone already."""
        row = FileRow(file_id, filename, purpose, len(content), self._clock())

        def write(conn: Connection) -> None:
            _require_room(conn, files, tenant_id, most, "files", "file", "max_files")
            conn.execute(
                sa.insert(files).values(
                    id=row.id,
                    tenant_id=tenant_id,
                    home_region=self.region,
                    filename=filename,
                    purpose=purpose,
                    bytes=row.bytes,
                    content=content,
                    created_at=row.created_at,
                )
            )

        await self.transaction(write)
        return row

    async def get_file(self, tenant_id: str, file_id: str) -> FileRow:
        return await self.transaction(lambda conn: file_row(conn, tenant_id, file_id))

    async def file_content(self, tenant_id: str, file_id: str) -> tuple[FileRow, bytes]:
        def read(conn: Connection) -> tuple[FileRow, bytes]:
            row = file_row(conn, tenant_id, file_id)
            content = conn.execute(sa.select(files.c.content).where(files.c.id == file_id)).scalar_one()
            return row, bytes(content)

        return await self.transaction(read)

    async def list_files(self, tenant_id: str, purpose: str, limit: int, after: str) -> Page[FileRow]:
        def read(conn: Connection) -> Page[FileRow]:
            query = sa.select(*FILE_COLUMNS).where(files.c.tenant_id == tenant_id)
            if purpose:
                query = query.where(files.c.purpose == purpose)
            if after:
                last = file_row(conn, tenant_id, after)
                query = query.where(before(files, last.created_at, last.id))
            rows = conn.execute(query.order_by(files.c.created_at.desc(), files.c.id.desc()).limit(limit + 1))
            found = [FileRow(*r) for r in rows]
            return Page(found[:limit], found[limit - 1].id if len(found) > limit else "")

        return await self.transaction(read)

    async def delete_file(self, tenant_id: str, file_id: str) -> None:
        def write(conn: Connection) -> None:
            file_row(conn, tenant_id, file_id)
            self._drop_chunks(conn, tenant_id, chunks.c.file_id == file_id)
            conn.execute(
                sa.delete(vector_store_files).where(
                    vector_store_files.c.tenant_id == tenant_id, vector_store_files.c.file_id == file_id
                )
            )
            _drop_batch_entries(conn, tenant_id, file_batch_files.c.file_id == file_id)
            conn.execute(sa.delete(files).where(files.c.id == file_id))

        await self.transaction(write)

    # ---------------------------------------------------------- vector stores

    async def create_vector_store(
        self, tenant_id: str, store_id: str, name: str, meta: dict[str, str], most: int = 0
    ) -> VectorStoreRow:
        """Make a vector store of the tenant's; with ``most``, refused as
        :meth:`create_file` is when the tenant keeps that many already."""
        now = self._clock()
        row = VectorStoreRow(store_id, name, dict(meta), now, now)

        def write(conn: Connection) -> None:
            _require_room(
                conn, vector_stores, tenant_id, most, "vector stores", "vector_store", "max_vector_stores"
            )
            conn.execute(
                sa.insert(vector_stores).values(
                    id=store_id,
                    tenant_id=tenant_id,
                    home_region=self.region,
                    name=name,
                    metadata_json=json.dumps(meta, sort_keys=True),
                    created_at=now,
                    last_active_at=now,
                )
            )

        await self.transaction(write)
        return row

    async def get_vector_store(self, tenant_id: str, store_id: str) -> VectorStoreRow:
        return await self.transaction(lambda conn: store_row(conn, tenant_id, store_id))

    async def list_vector_stores(self, tenant_id: str, limit: int, after: str) -> Page[VectorStoreRow]:
        def read(conn: Connection) -> Page[VectorStoreRow]:
            query = sa.select(vector_stores.c.id).where(vector_stores.c.tenant_id == tenant_id)
            if after:
                last = store_row(conn, tenant_id, after)
                query = query.where(before(vector_stores, last.created_at, last.id))
            ids = conn.execute(
                query.order_by(vector_stores.c.created_at.desc(), vector_stores.c.id.desc()).limit(limit + 1)
            ).scalars()
            found = [store_row(conn, tenant_id, i) for i in ids]
            return Page(found[:limit], found[limit - 1].id if len(found) > limit else "")

        return await self.transaction(read)

    async def delete_vector_store(self, tenant_id: str, store_id: str) -> None:
        def write(conn: Connection) -> None:
            store_row(conn, tenant_id, store_id)
            self._drop_chunks(conn, tenant_id, chunks.c.vector_store_id == store_id)
            conn.execute(
                sa.delete(vector_store_files).where(vector_store_files.c.vector_store_id == store_id)
            )
            _drop_batch_entries(conn, tenant_id, file_batch_files.c.vector_store_id == store_id)
            conn.execute(
                sa.delete(file_batches).where(
                    file_batches.c.tenant_id == tenant_id, file_batches.c.vector_store_id == store_id
                )
            )
            conn.execute(sa.delete(vector_stores).where(vector_stores.c.id == store_id))

        await self.transaction(write)

    # ------------------------------------------------------------ memberships

    async def add_file(
        self,
        tenant_id: str,
        store_id: str,
        file_id: str,
        pieces: Sequence[tuple[str, Sequence[float]]],
        chunking: tuple[int, int],
        error: str = "",
    ) -> VectorStoreFileRow:
        """The file's chunks (text, vector) in the store, replacing any it
        had there; with ``error`` a failed membership and no chunks."""
        now = self._clock()
        usage = sum(len(text.encode("utf-8")) for text, _ in pieces)
        row = VectorStoreFileRow(
            store_id,
            file_id,
            "failed" if error else "completed",
            usage,
            error,
            chunking[0],
            chunking[1],
            len(pieces),
            now,
        )

        def write(conn: Connection) -> VectorStoreFileRow:
            store_row(conn, tenant_id, store_id)
            file_row(conn, tenant_id, file_id)
            where = sa.and_(chunks.c.vector_store_id == store_id, chunks.c.file_id == file_id)
            self._drop_chunks(conn, tenant_id, where)
            conn.execute(
                sa.delete(vector_store_files).where(
                    vector_store_files.c.vector_store_id == store_id, vector_store_files.c.file_id == file_id
                )
            )
            conn.execute(
                sa.insert(vector_store_files).values(
                    tenant_id=tenant_id,
                    home_region=self.region,
                    vector_store_id=store_id,
                    file_id=file_id,
                    status=row.status,
                    usage_bytes=row.usage_bytes,
                    last_error=row.last_error,
                    max_chunk_chars=row.max_chunk_chars,
                    chunk_overlap_chars=row.chunk_overlap_chars,
                    chunks=row.chunks,
                    created_at=now,
                )
            )
            indexed: list[IndexedChunk] = []
            for position, (text, vector) in enumerate(pieces):
                chunk_id = conn.execute(
                    sa.insert(chunks)
                    .values(
                        tenant_id=tenant_id,
                        home_region=self.region,
                        vector_store_id=store_id,
                        file_id=file_id,
                        chunk_index=position,
                        text=text,
                        dimensions=len(vector),
                        embedding=self.index.encode(vector),
                    )
                    .returning(chunks.c.id)
                ).scalar_one()
                indexed.append(IndexedChunk(int(chunk_id), store_id, text, vector))
            self.index.add(conn, indexed)
            touch(conn, store_id, now)
            return row

        return await self.transaction(write)

    async def list_files_of(
        self, tenant_id: str, store_id: str, limit: int, after: str
    ) -> Page[VectorStoreFileRow]:
        def read(conn: Connection) -> Page[VectorStoreFileRow]:
            store_row(conn, tenant_id, store_id)
            vsf = vector_store_files
            query = sa.select(*MEMBER_COLUMNS).where(vsf.c.vector_store_id == store_id)
            return member_page(conn, store_id, query, limit, after)

        return await self.transaction(read)

    async def get_member(self, tenant_id: str, store_id: str, file_id: str) -> VectorStoreFileRow:
        """The file's membership in the tenant's store; NOT_FOUND when either is missing."""

        def read(conn: Connection) -> VectorStoreFileRow:
            store_row(conn, tenant_id, store_id)
            return member_row(conn, store_id, file_id)

        return await self.transaction(read)

    async def remove_file(self, tenant_id: str, store_id: str, file_id: str) -> None:
        def write(conn: Connection) -> None:
            store_row(conn, tenant_id, store_id)
            member_row(conn, store_id, file_id)
            where = sa.and_(chunks.c.vector_store_id == store_id, chunks.c.file_id == file_id)
            self._drop_chunks(conn, tenant_id, where)
            conn.execute(
                sa.delete(vector_store_files).where(
                    vector_store_files.c.vector_store_id == store_id, vector_store_files.c.file_id == file_id
                )
            )
            _drop_batch_entries(
                conn,
                tenant_id,
                sa.and_(
                    file_batch_files.c.vector_store_id == store_id, file_batch_files.c.file_id == file_id
                ),
            )
            touch(conn, store_id, self._clock())

        await self.transaction(write)

    async def require_stores(self, tenant_id: str, store_ids: Sequence[str]) -> None:
        """NOT_FOUND unless every one of ``store_ids`` is the tenant's."""

        def read(conn: Connection) -> None:
            for store_id in store_ids:
                store_row(conn, tenant_id, store_id)

        await self.transaction(read)

    # ----------------------------------------------------------------- search

    async def search(
        self,
        tenant_id: str,
        store_ids: Sequence[str],
        vector: Sequence[float],
        terms: Sequence[str],
        limit: int,
    ) -> list[ChunkHit]:
        """The ``limit`` best chunks of the tenant's ``store_ids`` for a query
        (its embedding and its words), best first, by fused rank."""

        def read(conn: Connection) -> list[ChunkHit]:
            for store_id in store_ids:
                store_row(conn, tenant_id, store_id)
            hits = hybrid_search(conn, self.index, tenant_id, store_ids, vector, terms, limit)
            now = self._clock()
            for store_id in store_ids:
                touch(conn, store_id, now)
            return hits

        return await self.transaction(read)

    async def purge_tenant(self, tenant_id: str) -> int:
        """Remove every file, vector store and chunk (with its index entries)
        of a deleted tenant; how many rows went."""

        def write(conn: Connection) -> int:
            removed = self._drop_chunks(conn, tenant_id, sa.true())
            for table in (file_batch_files, file_batches, vector_store_files, vector_stores, files):
                removed += conn.execute(sa.delete(table).where(table.c.tenant_id == tenant_id)).rowcount
            return int(removed)

        return await self.transaction(write)

    def _drop_chunks(self, conn: Connection, tenant_id: str, where: sa.ColumnElement[bool]) -> int:
        found = conn.execute(
            sa.select(chunks.c.id, chunks.c.dimensions).where(chunks.c.tenant_id == tenant_id, where)
        ).all()
        by_width: dict[int, list[int]] = {}
        for chunk_id, width in found:
            by_width.setdefault(int(width), []).append(int(chunk_id))
        for width, ids in by_width.items():
            self.index.remove(conn, ids, width)
        return int(conn.execute(sa.delete(chunks).where(chunks.c.tenant_id == tenant_id, where)).rowcount)


def _drop_batch_entries(conn: Connection, tenant_id: str, where: sa.ColumnElement[bool]) -> None:
    """Take the tenant's files matching ``where`` out of the batches that added them."""
    conn.execute(sa.delete(file_batch_files).where(file_batch_files.c.tenant_id == tenant_id, where))


def _require_room(
    conn: Connection, table: sa.Table, tenant_id: str, most: int, things: str, param: str, cap: str
) -> None:
    """FAILED_PRECONDITION when the tenant keeps ``most`` (> 0) rows of ``table`` in the zone already."""
    if most <= 0:
        return
    kept = conn.execute(
        sa.select(sa.func.count()).select_from(table).where(table.c.tenant_id == tenant_id)
    ).scalar_one()
    if kept >= most:
        raise FailedPrecondition(
            Reason.INVALID_REQUEST,
            f"the tenant keeps {kept} {things} in this zone, its most ({cap} {most}): delete some, "
            f"or raise the cap (llmmesh admin tenant update --{cap.replace('_', '-')})",
            metadata={"param": param, "limit": str(most)},
        )
