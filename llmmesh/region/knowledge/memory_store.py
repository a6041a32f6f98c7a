"""The facts kept about a tenant's end users, in the zone's retrieval store
(beside the files and vector stores): one row per fact, keyed by tenant and
end user, a fact kept once per user."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import NotFound
from llmmesh.core.sqlstore import UtcDateTime, insert_new_rows
from llmmesh.region.knowledge.vector_store import VectorStoreDb
from llmmesh.region.knowledge.vector_store_rows import Page

MEMORY_NOT_FOUND = "MEMORY_NOT_FOUND"
MAX_FACTS_PER_USER = 200
"""Kept per end user; the oldest go first."""

metadata = sa.MetaData()
memories = sa.Table(
    "user_memories",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("end_user", sa.String(256), nullable=False),
    sa.Column("home_region", sa.String(64), nullable=False),
    sa.Column("content", sa.String(512), nullable=False),
    sa.Column("source_request_id", sa.String(128), nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.UniqueConstraint("tenant_id", "end_user", "content", name="uq_user_memories_fact"),
    sa.Index("ix_user_memories_user", "tenant_id", "end_user", "created_at"),
)


@dataclass(frozen=True)
class MemoryRow:
    id: str
    end_user: str
    content: str
    source_request_id: str
    created_at: datetime


class MemoryStore:
    """Facts about end users, in the transactions of the zone's retrieval store."""

    def __init__(self, db: VectorStoreDb) -> None:
        self._db = db

    def create_schema(self) -> None:
        self._db.create_tables(metadata)

    async def remember(
        self, tenant_id: str, user: str, facts: list[str], request_id: str, most: int = MAX_FACTS_PER_USER
    ) -> int:
        """Keep the facts not yet known about ``user``, the ``most`` newest of
        them (the oldest go first); how many were new."""
        now = datetime.now(UTC)
        rows = [
            {
                "id": f"mem_{secrets.token_hex(12)}",
                "tenant_id": tenant_id,
                "end_user": user,
                "home_region": self._db.region,
                "content": fact,
                "source_request_id": request_id,
                "created_at": now,
            }
            for fact in facts
        ]

        def write(conn: Connection) -> int:
            known = set(
                conn.execute(
                    sa.select(memories.c.content).where(
                        memories.c.tenant_id == tenant_id, memories.c.end_user == user
                    )
                ).scalars()
            )
            new = [r for r in rows if r["content"] not in known]
            inserted = insert_new_rows(conn, memories, new) if new else set()
            kept = conn.execute(
                sa.select(memories.c.id)
                .where(memories.c.tenant_id == tenant_id, memories.c.end_user == user)
                .order_by(memories.c.created_at.desc(), memories.c.id.desc())
                .offset(max(1, most))
            ).scalars()
            stale = list(kept)
            if stale:
                conn.execute(sa.delete(memories).where(memories.c.id.in_(stale)))
            return len(inserted)

        return await self._db.transaction(write)

    async def recall(self, tenant_id: str, user: str, limit: int, after: str = "") -> Page[MemoryRow]:
        """``user``'s facts, newest first."""

        def read(conn: Connection) -> Page[MemoryRow]:
            query = sa.select(
                memories.c.id,
                memories.c.end_user,
                memories.c.content,
                memories.c.source_request_id,
                memories.c.created_at,
            ).where(memories.c.tenant_id == tenant_id, memories.c.end_user == user)
            if after:
                last = conn.execute(
                    sa.select(memories.c.created_at).where(
                        memories.c.id == after, memories.c.tenant_id == tenant_id, memories.c.end_user == user
                    )
                ).scalar_one_or_none()
                if last is None:
                    raise NotFound(MEMORY_NOT_FOUND, f"no memory {after!r}", metadata={"param": "after"})
                query = query.where(
                    sa.or_(
                        memories.c.created_at < last,
                        sa.and_(memories.c.created_at == last, memories.c.id < after),
                    )
                )
            found = [
                MemoryRow(*r)
                for r in conn.execute(
                    query.order_by(memories.c.created_at.desc(), memories.c.id.desc()).limit(limit + 1)
                )
            ]
            return Page(found[:limit], found[limit - 1].id if len(found) > limit else "")

        return await self._db.transaction(read)

    async def purge_tenant(self, tenant_id: str) -> int:
        """Remove every fact of a deleted tenant's end users; how many went."""

        def write(conn: Connection) -> int:
            return int(conn.execute(sa.delete(memories).where(memories.c.tenant_id == tenant_id)).rowcount)

        return await self._db.transaction(write)

    async def forget(self, tenant_id: str, memory_id: str = "", user: str = "") -> int:
        """Delete one fact (NOT_FOUND when the tenant has none of that id,
        or, with ``user`` too, none of that id about that user) or every fact
        of ``user``."""

        def write(conn: Connection) -> int:
            where = [memories.c.tenant_id == tenant_id]
            if memory_id:
                where.append(memories.c.id == memory_id)
            if user or not memory_id:
                where.append(memories.c.end_user == user)
            deleted = conn.execute(sa.delete(memories).where(*where)).rowcount
            if memory_id and not deleted:
                about = f" about user {user!r}" if user else ""
                raise NotFound(
                    MEMORY_NOT_FOUND, f"no memory {memory_id!r}{about}", metadata={"param": "memory_id"}
                )
            return int(deleted)

        return await self._db.transaction(write)
