"""SqlStore.grouped: work that arrives together commits in one transaction,
each piece in a savepoint of its own, on every backend a store runs on."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.sqlstore import GROUP_LIMIT, SqlStore, create_store_engine

pytestmark = pytest.mark.asyncio

_ROWS = sa.Table(
    "rows", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.Text)
)


@pytest.fixture(params=["memory", "file", pytest.param("postgresql", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "postgresql":
        url = str(request.getfixturevalue("postgres_schema_url"))
    else:
        url = "sqlite://" if request.param == "memory" else f"sqlite:///{tmp_path / 'group.db'}"
    store = SqlStore(create_store_engine(url))
    store.create_tables(_ROWS.metadata)
    try:
        yield store
    finally:
        store.dispose()


def commits_of(store: SqlStore) -> list[int]:
    counted = [0]

    @sa.event.listens_for(store.engine, "commit")
    def _on_commit(conn: Connection) -> None:
        counted[0] += 1

    return counted


def insert(row_id: int, fail: bool = False) -> Callable[[Connection], int]:
    def work(conn: Connection) -> int:
        conn.execute(sa.insert(_ROWS).values(id=row_id, v=f"row {row_id}"))
        if fail:
            raise ValueError(f"row {row_id} refused")
        return row_id

    return work


def stored(store: SqlStore) -> list[int]:
    return store.run_transaction(
        lambda conn: list(conn.execute(sa.select(_ROWS.c.id).order_by(_ROWS.c.id)).scalars())
    )


async def test_work_arriving_together_commits_once(store: SqlStore) -> None:
    commits = commits_of(store)
    results = await asyncio.gather(*(store.grouped(insert(i)) for i in range(20)))
    assert results == list(range(20))
    assert stored(store) == list(range(20))
    # Groups of at most GROUP_LIMIT, the first maybe alone.
    assert commits[0] <= 1 + -(-20 // GROUP_LIMIT)
    commits[0] = 0
    assert await store.grouped(insert(99)) == 99  # alone: a group of one
    assert commits[0] == 1


async def test_urgent_work_goes_ahead_of_waiting_work(store: SqlStore) -> None:
    ran: list[int] = []

    def logged(row_id: int) -> Callable[[Connection], int]:
        def work(conn: Connection) -> int:
            ran.append(row_id)
            return insert(row_id)(conn)

        return work

    commits = commits_of(store)
    waiting = [store.grouped(logged(i)) for i in range(3 * GROUP_LIMIT)]
    urgent = [store.grouped(logged(100 + i), urgency=1) for i in range(2)]
    most = store.grouped(logged(200), urgency=2)
    assert await asyncio.gather(*waiting, *urgent, most) == [*range(3 * GROUP_LIMIT), 100, 101, 200]
    # The most urgent first, then both pieces of urgency 1 in one group, before any of the others.
    assert ran[:3] == [200, 100, 101]
    assert ran[3:] == list(range(3 * GROUP_LIMIT))
    assert commits[0] == 2 + 3
    assert stored(store) == [*range(3 * GROUP_LIMIT), 100, 101, 200]


async def test_a_failing_member_rolls_back_only_its_own_writes(store: SqlStore) -> None:
    await store.grouped(insert(1))
    outcomes = await asyncio.gather(
        store.grouped(insert(2)),
        store.grouped(insert(3, fail=True)),
        store.grouped(insert(1)),  # a duplicate key: the database refuses it
        store.grouped(insert(4)),
        return_exceptions=True,
    )
    assert outcomes[0] == 2 and outcomes[3] == 4
    assert isinstance(outcomes[1], ValueError) and "row 3 refused" in str(outcomes[1])
    assert isinstance(outcomes[2], sa.exc.IntegrityError)
    assert stored(store) == [1, 2, 4]


async def test_no_savepoint_is_taken_and_a_failing_member_runs_once(store: SqlStore) -> None:
    savepoints, runs = [0], [0]

    @sa.event.listens_for(store.engine, "savepoint")
    def _on_savepoint(conn: Connection, name: str) -> None:
        savepoints[0] += 1

    def refused_once_run(conn: Connection) -> int:
        runs[0] += 1
        return insert(5, fail=True)(conn)

    outcomes = await asyncio.gather(
        store.grouped(insert(1)),
        store.grouped(refused_once_run),
        store.grouped(insert(2)),
        return_exceptions=True,
    )
    assert outcomes[0] == 1 and isinstance(outcomes[1], ValueError) and outcomes[2] == 2
    assert runs[0] == 1
    assert savepoints[0] == 0
    assert stored(store) == [1, 2]


async def test_a_caller_that_goes_away_does_not_stop_its_write(store: SqlStore) -> None:
    gone = asyncio.create_task(store.grouped(insert(7)))
    waiting = asyncio.create_task(store.grouped(insert(8)))
    await asyncio.sleep(0)
    gone.cancel()
    assert await waiting == 8
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert stored(store) == [7, 8]


async def test_a_locked_database_runs_the_whole_group_again(store: SqlStore) -> None:
    attempts = [0]

    def locked_once(conn: Connection) -> str:
        attempts[0] += 1
        conn.execute(sa.insert(_ROWS).values(id=10 + attempts[0], v="attempt"))
        if attempts[0] == 1:
            raise sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
        return "written"

    results = await asyncio.gather(store.grouped(insert(1)), store.grouped(locked_once))
    assert list(results) == [1, "written"]
    assert attempts[0] == 2
    # The first attempt's writes, the other member's included, were rolled back and done once again.
    assert stored(store) == [1, 12]


async def test_dispose_waits_for_a_transaction_whose_caller_went_away(store: SqlStore) -> None:
    """A cancelled caller's transaction goes on in its thread; disposing the
    store waits for it, so its connection is closed, not left to a pool nobody
    closes (psycopg warns about such a connection when it is collected)."""
    began, ended = threading.Event(), threading.Event()

    def slow(conn: Connection) -> None:
        began.set()
        time.sleep(0.3)
        conn.execute(sa.insert(_ROWS).values(id=99, v="late"))
        ended.set()

    caller = asyncio.create_task(store.transaction(slow))
    await asyncio.to_thread(began.wait, 5)
    caller.cancel()
    await asyncio.to_thread(store.dispose)
    assert ended.is_set()  # the pool closed only after the transaction ended
