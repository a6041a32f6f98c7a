"""What every plane's SQL store stands on: SQLAlchemy 2 over SQLite (embedded), PostgreSQL or CockroachDB.

Why a synchronous engine run through :func:`asyncio.to_thread` rather than
``sqlalchemy.ext.asyncio``: the drivers this project already ships
(psycopg 3, the standard library's sqlite3) are used in their plain,
well-trodden sync mode, no extra driver (aiosqlite) becomes a dependency, and
every unit of work is a short function over one ``Connection`` that runs in
one transaction on a worker thread. The event loop never blocks on I/O, and
concurrency comes from the connection pool, not from greenlets.

Transactions: :meth:`SqlStore.transaction` runs a function inside one
transaction and retries the whole of it, after a short randomized backoff,
when PostgreSQL or CockroachDB abort it for a serialization conflict or
deadlock (SQLSTATE 40001 / 40P01) or SQLite reports its database locked, so
callers write plain read-then-write code and rely on constraints (primary
keys, unique names) for correctness under concurrency. On SQLite every write
transaction begins ``IMMEDIATE`` (one writer at a time across processes) and
calls from one process are serialized on a lock, since the embedded database
has a single writer anyway. Writes that arrive together (the records of the
turns one decode step ends) can share one transaction, each failing on its
own, on the store's writer thread: :meth:`SqlStore.grouped`.

Transactions that fail for the database's sake (it is unreachable, or
conflicts outlast every retry) are counted in ``llmmesh_store_errors_total``
by :attr:`SqlStore.store_label` (:mod:`llmmesh.core.dependency_metrics`);
:meth:`SqlStore.ping` is a plane's readiness check of its store.

The column types here (:class:`ExactDecimal`, :class:`UtcDateTime`) keep
money exact and times aware on every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import dml as postgresql_dml
from sqlalchemy.dialects.sqlite import dml as sqlite_dml
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeDecorator, TypeEngine

from llmmesh.core.dependency_metrics import STORE_ERROR_KINDS, STORE_ERRORS
from llmmesh.core.migrations import MigrationSet, StoreNotMigrated, revision, upgrade

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
"""serialization_failure (CockroachDB's "restart transaction" too) and deadlock_detected."""
_INSERT_CHUNK = 500  # rows per INSERT: keeps SQLite under its bound-parameter limit


def is_retryable(err: sa.exc.DBAPIError) -> bool:
    """Whether running the whole transaction again may succeed: a serialization
    failure or deadlock, or SQLite's "database is locked" once its busy timeout ran out."""
    orig = err.orig
    if isinstance(orig, sqlite3.OperationalError):
        return "locked" in str(orig)
    return getattr(orig, "sqlstate", None) in RETRYABLE_SQLSTATES


_SQLITE_UNAVAILABLE = ("unable to open", "disk I/O error", "readonly database", "database disk image")


def failure_kind(err: sa.exc.DBAPIError, *, retries_left: bool) -> str | None:
    """What a transaction's error says about the database, for
    ``llmmesh_store_errors_total``: ``unavailable`` (it could not be reached
    or dropped the connection), ``conflict`` (a retryable error with no retry
    left), or None (a constraint or statement error: the caller's)."""
    if is_retryable(err):
        return None if retries_left else "conflict"
    if isinstance(err.orig, sqlite3.OperationalError):
        # sqlite3 raises it for bad statements too; only these are the database's.
        return "unavailable" if any(s in str(err.orig) for s in _SQLITE_UNAVAILABLE) else None
    if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError):
        return "unavailable"
    return None


def _prepare_sqlite(engine: Engine, *, file_backed: bool) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN, not the sqlite3 module.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        if file_backed:
            # Write-ahead log, synced at checkpoints rather than on every
            # commit: a commit costs one append instead of several fsyncs.
            # A process that dies (the failure the mesh is built for) loses
            # nothing committed; only an operating-system crash can lose the
            # last commits, which the production stores (PostgreSQL,
            # CockroachDB) do not trade.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front: a deferred transaction that
        # reads and then writes can fail with "database is locked" instead of waiting.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


_PSYCOPG = {"postgresql": "postgresql+psycopg", "cockroachdb": "cockroachdb+psycopg"}
"""The driver a URL that names none gets, by database."""


def with_store_driver(url: str) -> sa.URL:
    """``url`` parsed, with psycopg (3) for a PostgreSQL or CockroachDB URL that names no driver."""
    parsed = sa.make_url(url)
    if parsed.drivername in _PSYCOPG:
        parsed = parsed.set(drivername=_PSYCOPG[parsed.drivername])
    return parsed


def create_store_engine(url: str) -> Engine:
    """An engine for ``url`` configured the way a store needs it (SQLite pragmas, pooling).

    ``sqlite://`` (or ``sqlite:///:memory:``) is one in-memory database
    shared by every caller; ``sqlite:///path`` creates missing parent
    folders and runs in write-ahead-log mode; ``postgresql+psycopg://`` and ``cockroachdb+psycopg://`` pool
    connections and check them before use. A ``postgresql://`` or
    ``cockroachdb://`` URL that names no driver gets psycopg (3), the one
    this project ships: SQLAlchemy's default for them, psycopg2, is not
    installed, and the URL's query (``sslmode``, certificates) means the same to both.
    """
    parsed = with_store_driver(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, pool_pre_ping=True)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        # One shared connection, or every pooled connection would be its own empty database.
        engine = sa.create_engine(parsed, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"check_same_thread": False})
    _prepare_sqlite(engine, file_backed=database not in ("", ":memory:"))
    return engine


class _SqliteSkipConflicts(sqlite_dml.OnConflictDoNothing):
    """``ON CONFLICT DO NOTHING`` with no conflict target: every one is the
    same, so its cache key is its class alone (nothing to traverse)."""

    _traverse_internals: list[tuple[str, InternalTraversal]] = []  # noqa: RUF012 - an instance variable to SQLAlchemy's types


class _PostgresSkipConflicts(postgresql_dml.OnConflictDoNothing):
    """:class:`_SqliteSkipConflicts` for the PostgreSQL family."""

    _traverse_internals: list[tuple[str, InternalTraversal]] = []  # noqa: RUF012 - an instance variable to SQLAlchemy's types


class _SqliteInsertNew(sqlite.Insert):
    """SQLite's ``INSERT``, only ever with :class:`_SqliteSkipConflicts`
    (:func:`insert_new_rows`), so that its compiled form is cached. The
    dialects' own ``Insert`` is never cached, since their conflict clauses
    carry no cache key."""

    inherit_cache = True


class _PostgresInsertNew(postgresql.Insert):
    """:class:`_SqliteInsertNew` for the PostgreSQL family."""

    inherit_cache = True


@functools.cache
def _insert_new(table: sa.Table, dialect: str) -> sa.Insert:
    """``INSERT … ON CONFLICT DO NOTHING RETURNING`` the primary key of
    ``table``, built once (a statement is immutable) and compiled once."""
    keys = table.primary_key.columns
    if dialect == "sqlite":
        stmt: sa.Insert = _SqliteInsertNew(table).returning(*keys)
        stmt._post_values_clause = _SqliteSkipConflicts()
    else:
        stmt = _PostgresInsertNew(table).returning(*keys)
        stmt._post_values_clause = _PostgresSkipConflicts()
    return stmt


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
    # Values travel as parameters, not inlined in the statement, and the
    # statement is compiled once (see _SqliteInsertNew): compiling was most
    # of a one-row insert's cost.
    stmt = _insert_new(table, "sqlite" if conn.dialect.name == "sqlite" else "postgresql")
    inserted: set[tuple[Any, ...]] = set()
    for start in range(0, len(ordered), _INSERT_CHUNK):
        chunk = ordered[start : start + _INSERT_CHUNK]
        params: dict[str, Any] | list[dict[str, Any]] = chunk[0] if len(chunk) == 1 else chunk
        inserted.update(tuple(row) for row in conn.execute(stmt, params))
    return inserted


class ExactDecimal(TypeDecorator[Decimal]):
    """A decimal stored without rounding: NUMERIC where the database has it.

    SQLite has no exact decimal type (its NUMERIC affinity converts to a
    float), so there the value travels as its canonical string.
    """

    impl = sa.Numeric
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.String(80))
        return dialect.type_descriptor(sa.Numeric(asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        return format(value, "f") if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(value)


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every backend (SQLite drops the offset, so it is restored on read)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a store")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SqlStore:
    """An engine and the one way to run work on it: whole transactions, retried when that is safe.

    ``max_attempts`` bounds the runs of one transaction; between runs it
    waits a random time up to ``min_backoff_s`` doubled per attempt, at most
    ``max_backoff_s``, so conflicting transactions stop colliding in step.
    """

    store_label: ClassVar[str] = "sql"
    """The ``store`` label of this store's ``llmmesh_store_errors_total``."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_attempts: int = 8,
        min_backoff_s: float = 0.005,
        max_backoff_s: float = 0.5,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.engine = engine
        self._serial: threading.Lock | None = threading.Lock() if engine.dialect.name == "sqlite" else None
        self._max_attempts = max_attempts
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._group = _GroupCommit(self)
        # Transactions running on worker threads; dispose waits for them.
        self._running = 0
        self._idle = threading.Condition()
        # Every kind exported from the start, at 0, so increase() sees the first error.
        for kind in STORE_ERROR_KINDS:
            STORE_ERRORS.labels(store=self.store_label, kind=kind)

    async def transaction(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one transaction on a worker thread; commit if it returns.

        Any exception rolls back. Serialization failures, deadlocks and a
        locked SQLite database are retried from the start, so ``work`` must
        have no side effects outside the connection.
        """
        return await asyncio.to_thread(self.run_transaction, work)

    async def grouped(self, work: Callable[[Connection], T], *, urgency: int = 0) -> T:
        """:meth:`transaction`, committed together with the other grouped
        work that arrives while a group is being written (group commit).

        Turns that end on the same decode step each write their record at
        once; one transaction for all of them costs one thread hop, one
        ``BEGIN`` and one commit instead of one each. A ``work`` that raises
        gets its own error and leaves no write (the others run again
        without it; no savepoint around each member, two statements less
        each); a conflict that aborts the transaction runs the whole group
        again.

        Work of an ``urgency`` above 0 is what a caller waits on before it
        can answer (a turn's acceptance, say): the waiting work of the
        highest urgency goes in a group of its own, ahead of the rest (a
        smaller group commits sooner), and groups of work no caller waits
        on take at most ``GROUP_LIMIT`` members, so urgent work waits for at
        most one small group already being written.
        """
        return await self._group.run(work, urgency)

    def run_transaction(self, work: Callable[[Connection], T]) -> T:
        """:meth:`transaction` on the calling thread (which it blocks)."""
        with self._idle:
            self._running += 1
        try:
            return self._attempts(work)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _attempts(self, work: Callable[[Connection], T]) -> T:
        for attempt in range(1, self._max_attempts + 1):
            try:
                with self._exclusive(), self.engine.begin() as conn:
                    return work(conn)
            except sa.exc.DBAPIError as err:
                retries_left = attempt < self._max_attempts
                kind = failure_kind(err, retries_left=retries_left)
                if kind is not None:
                    STORE_ERRORS.labels(store=self.store_label, kind=kind).inc()
                if not retries_left or not is_retryable(err):
                    raise
                log.debug("retrying a transaction (attempt %d) after %s", attempt, err.orig)
            # Outside the serial lock, so the conflicting writer can finish meanwhile.
            time.sleep(random.uniform(0, min(self._max_backoff_s, self._min_backoff_s * 2 ** (attempt - 1))))
        raise AssertionError("unreachable")  # pragma: no cover

    async def ping(self) -> None:
        """Run ``SELECT 1`` in a transaction: raises when the database does
        not answer (a plane's readiness check; counted as any failure is)."""
        await self.transaction(lambda conn: conn.execute(sa.text("SELECT 1")).scalar_one())

    def migrate(self, migrations: MigrationSet) -> None:
        """Bring the database to the head revision of ``migrations``
        (:mod:`llmmesh.core.migrations`): SQLite and PostgreSQL are upgraded
        in one transaction; CockroachDB, which the operator upgrades, is only
        checked: StoreNotMigrated when it is not at the head."""
        if self.engine.dialect.name == "cockroachdb":
            with self.engine.connect() as conn:
                current = revision(conn, migrations)
            head = migrations.head()
            if current != head:
                raise StoreNotMigrated(
                    f"the {migrations.name} store at {self.engine.url!r} is at revision {current or 'none'}; "
                    f"this release needs {head}: run `llmmesh db upgrade` (the chart's migration Job runs it)"
                )
            return
        with self._exclusive(), self.engine.begin() as conn:
            upgrade(conn, migrations)

    def create_tables(self, metadata: sa.MetaData) -> None:
        """Create the tables of ``metadata`` that are missing; existing ones are left as they are."""
        with self._exclusive():
            metadata.create_all(self.engine)

    def dispose(self) -> None:
        """Close pooled connections, after any transaction still running
        (for up to ``DISPOSE_WAIT_S``).

        A transaction whose caller went away (a cancelled RPC) goes on in its
        worker thread; disposing under it would leave its connection to a
        pool nobody closes, open until it is collected. Taking the serial
        lock matters for in-memory SQLite too: its one shared connection
        closed under a running statement crashes the process.
        """
        with self._idle:
            if not self._idle.wait_for(lambda: self._running == 0, timeout=DISPOSE_WAIT_S):
                log.warning("disposing the store with %d transactions still running", self._running)
        self._group.close()
        with self._exclusive():
            self.engine.dispose()

    def _exclusive(self) -> contextlib.AbstractContextManager[Any]:
        return self._serial if self._serial is not None else contextlib.nullcontext()


DISPOSE_WAIT_S = 10.0
"""How long :meth:`SqlStore.dispose` waits for running transactions."""

GROUP_LIMIT = 8
"""The most members of a group of work no caller waits on (urgency 0)."""


class _Grouped:
    """One piece of grouped work and where its outcome goes."""

    def __init__(self, work: Callable[[Connection], Any], urgency: int) -> None:
        self.work = work
        self.urgency = urgency
        self.outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # Retrieved here, so the error of a member whose caller went away is not reported as lost.
        self.outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.result: Any = None
        self.error: BaseException | None = None


class _GroupCommit:
    """The grouping behind :meth:`SqlStore.grouped`: work that arrives while
    a group is being written waits and goes in the next group.

    Groups are written one at a time on a thread of their own. The end of
    a group's transaction settles its members and hands over the next group
    in one callback on the loop, with no task in between: a member's caller
    resumes one loop turn after its transaction commits (on a busy loop,
    each turn is milliseconds)."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self._pending: list[_Grouped] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing = False
        self._thread: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run(self, work: Callable[[Connection], T], urgency: int) -> T:
        item = _Grouped(work, urgency)
        self._pending.append(item)
        loop = asyncio.get_running_loop()
        if not self._writing or loop is not self._loop:
            # Next turn of the loop: work arriving in this one joins the group.
            self._loop, self._writing = loop, True
            loop.call_soon(self._write_next)
        # A caller that goes away leaves its work in the group: only the answer is dropped.
        result: T = await item.outcome
        return result

    def close(self) -> None:
        """Let the writer thread go (a later group starts another)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)

    def _write_next(self) -> None:
        """Hand the next group to the writer thread, if any waits."""
        loop = self._loop
        assert loop is not None
        while self._pending:
            group = self._next_group()
            write = functools.partial(_write_group, self._store, group)
            try:
                written = self._writer().submit(contextvars.copy_context().run, write)
            except RuntimeError as err:  # the interpreter is shutting down
                for item in group:
                    _settle(item.outcome, None, err)
                continue
            written.add_done_callback(functools.partial(self._from_thread, loop, group))
            return
        self._writing = False

    def _from_thread(
        self, loop: asyncio.AbstractEventLoop, group: list[_Grouped], done: Future[None]
    ) -> None:
        """The writer thread ended ``group``'s transaction: settle it on the loop."""
        loop.call_soon_threadsafe(self._written, group, done)

    def _written(self, group: list[_Grouped], done: Future[None]) -> None:
        """Settle ``group``'s members and hand over the next group."""
        try:
            done.result()
        except BaseException as err:  # the commit itself failed: every member fails with it
            for item in group:
                _settle(item.outcome, None, err)
        else:
            for item in group:
                _settle(item.outcome, item.result, item.error)
        self._write_next()

    def _writer(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlstore-group")
            return self._thread

    def _next_group(self) -> list[_Grouped]:
        """The waiting work of the highest urgency if any is urgent, else the
        oldest ``GROUP_LIMIT`` members; taken off the waiting list."""
        most = max(item.urgency for item in self._pending)
        if most > 0:
            group = [item for item in self._pending if item.urgency == most]
            self._pending = [item for item in self._pending if item.urgency != most]
            return group
        group, self._pending = self._pending[:GROUP_LIMIT], self._pending[GROUP_LIMIT:]
        return group


class _MemberFailed(Exception):
    """A member of a group failed: the transaction is rolled back and the group runs again without it."""

    def __init__(self, item: _Grouped, error: BaseException) -> None:
        super().__init__(str(error))
        self.item, self.error = item, error


def _write_group(store: SqlStore, group: Sequence[_Grouped]) -> None:
    """Write ``group`` in one transaction, its members one after the other
    with no savepoint around each (two statements less per member). A
    member that fails gets its error and is not run again; the transaction
    is rolled back and the rest run again without it, so a failure rolls
    back no other member's writes. An error that calls for the whole
    transaction to run again (a conflict, a locked database) is raised for
    :meth:`SqlStore.run_transaction` to retry."""
    members = list(group)
    while members:
        try:
            store.run_transaction(functools.partial(_run_group, group=members))
        except _MemberFailed as failed:
            failed.item.result, failed.item.error = None, failed.error
            members.remove(failed.item)
        else:
            return


def _run_group(conn: Connection, group: Sequence[_Grouped]) -> None:
    for item in group:
        item.result, item.error = None, None
        try:
            item.result = item.work(conn)
        except sa.exc.DBAPIError as err:
            if is_retryable(err):
                raise
            raise _MemberFailed(item, err) from err
        except Exception as err:
            raise _MemberFailed(item, err) from err


def _settle(outcome: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if outcome.done():
        return
    if isinstance(error, asyncio.CancelledError):
        outcome.cancel()
    elif error is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(result)
