"""The global store: SQLAlchemy 2 over SQLite (embedded), PostgreSQL or CockroachDB.

Why a synchronous engine run through :func:`asyncio.to_thread` rather than
``sqlalchemy.ext.asyncio``: the drivers this project already ships
(psycopg 3, the standard library's sqlite3) are used in their plain,
well-trodden sync mode, no extra driver (aiosqlite) becomes a dependency, and
every unit of work is a short function over one ``Connection`` that runs in
one transaction on a worker thread. The event loop never blocks on I/O, and
concurrency comes from the connection pool, not from greenlets.

Transactions: :meth:`GlobalStore.transaction` runs a function inside one
transaction and retries it when PostgreSQL or CockroachDB abort it for a
serialization conflict or deadlock, so callers write plain
read-then-write code and rely on constraints (primary keys, unique names)
for correctness under concurrency. On SQLite every write transaction begins
``IMMEDIATE`` (one writer at a time across processes) and calls from one
process are serialized on a lock, since the embedded database has a single
writer anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.pool import StaticPool

from globalplane import schema
from llmmesh.home import mesh_home

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
_MAX_ATTEMPTS = 8
_INSERT_CHUNK = 500  # rows per INSERT: keeps SQLite under its bound-parameter limit


def default_database_url(environ: Mapping[str, str] | None = None) -> str:
    """``sqlite:///$LLMMESH_HOME/global.db`` (``~/.llmmesh`` when unset), like ``llmmesh up``'s home."""
    return f"sqlite:///{mesh_home(environ) / 'global.db'}"


def global_locality_statements(dialect: Dialect | None = None) -> list[str]:
    """``ALTER TABLE … SET LOCALITY GLOBAL`` for each control-plane table.

    In a multi-region CockroachDB, GLOBAL tables serve fast, consistent reads
    in every region at the cost of slower writes: right for tenants, keys,
    models and prices, which every region reads on each request and which
    change rarely. Usage tables keep the database's default locality.
    """
    if dialect is None:
        from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

        dialect = CockroachDBDialect_psycopg()
    quote = dialect.identifier_preparer.format_table
    return [f"ALTER TABLE {quote(table)} SET LOCALITY GLOBAL" for table in schema.CONTROL_PLANE_TABLES]


def insert_new_rows(
    conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]
) -> set[tuple[Any, ...]]:
    """Insert ``rows``, skipping any whose primary key exists; the primary keys actually inserted.

    ``INSERT … ON CONFLICT DO NOTHING RETURNING`` on SQLite and the
    PostgreSQL family alike: a concurrent transaction inserting the same key
    makes this one wait for its outcome, so each key is inserted once.
    Rows go in primary-key order, so two overlapping batches lock keys in
    the same order and cannot deadlock each other.
    """
    keys = list(table.primary_key.columns)
    ordered = sorted(rows, key=lambda row: tuple(row[c.name] for c in keys))
    make_insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
    inserted: set[tuple[Any, ...]] = set()
    for start in range(0, len(ordered), _INSERT_CHUNK):
        chunk = ordered[start : start + _INSERT_CHUNK]
        stmt = make_insert(table).values(chunk).on_conflict_do_nothing().returning(*keys)
        inserted.update(tuple(row) for row in conn.execute(stmt))
    return inserted


def _is_retryable(err: sa.exc.DBAPIError) -> bool:
    return getattr(err.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


def _prepare_sqlite(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN, not the sqlite3 module.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front: a deferred transaction that
        # reads and then writes can fail with "database is locked" instead of waiting.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def create_store_engine(url: str) -> Engine:
    """An engine for ``url`` configured the way the store needs it (SQLite pragmas, pooling)."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, pool_pre_ping=True)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        # One shared connection, or every pooled connection would be its own empty database.
        engine = sa.create_engine(parsed, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"check_same_thread": False})
    _prepare_sqlite(engine)
    return engine


class GlobalStore:
    """The database behind the tenant book, model catalog and usage ledger."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._serial: threading.Lock | None = threading.Lock() if engine.dialect.name == "sqlite" else None

    @classmethod
    async def open(cls, url: str) -> GlobalStore:
        """Connect to ``url`` and create any missing table."""
        store = cls(create_store_engine(url))
        await asyncio.to_thread(store.create_schema)
        return store

    def create_schema(self) -> None:
        """Create missing tables and the policy version row; existing ones are left as they are."""
        with self._exclusive():
            schema.metadata.create_all(self.engine)
            with self.engine.begin() as conn:
                insert_new_rows(conn, schema.policy_version, [{"id": 1, "version": 0}])

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one transaction on a worker thread; commit if it returns.

        Any exception rolls back. Serialization failures and deadlocks are
        retried from the start, so ``work`` must have no side effects
        outside the connection.
        """
        return await asyncio.to_thread(self._run, work)

    def dispose(self) -> None:
        """Close pooled connections, after any operation still running.

        Taking the serial lock matters for in-memory SQLite: its one shared
        connection closed under a running statement crashes the process.
        """
        with self._exclusive():
            self.engine.dispose()

    def _run(self, work: Callable[[Connection], T]) -> T:
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self._exclusive(), self.engine.begin() as conn:
                    return work(conn)
            except sa.exc.DBAPIError as err:
                if attempt == _MAX_ATTEMPTS or not _is_retryable(err):
                    raise
                log.debug("retrying a transaction after %s", err.orig)
        raise AssertionError("unreachable")  # pragma: no cover

    def _exclusive(self) -> contextlib.AbstractContextManager[Any]:
        return self._serial if self._serial is not None else contextlib.nullcontext()
