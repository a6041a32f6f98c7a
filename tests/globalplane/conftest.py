"""Stores for the global plane's tests: embedded SQLite always, real PostgreSQL when it runs.

Each PostgreSQL test gets a schema of its own (dropped afterwards), so runs
never see each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from globalplane.store import GlobalStore, create_store_engine

StoreFactory = Callable[[], GlobalStore]
"""Opens another store (its own engine and pool) on the same database."""


def _postgres_schema_engine(url: str, schema_name: str) -> sa.Engine:
    return sa.create_engine(url, connect_args={"options": f"-csearch_path={schema_name}"})


@pytest.fixture
def postgres_stores(postgres_url: str) -> Iterator[StoreFactory]:
    """Opens stores on one fresh PostgreSQL schema; the first creates the tables."""
    schema_name = f"gp_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema_name}"')
    opened: list[GlobalStore] = []

    def open_store() -> GlobalStore:
        store = GlobalStore(_postgres_schema_engine(postgres_url, schema_name))
        if not opened:
            store.create_schema()
        opened.append(store)
        return store

    try:
        yield open_store
    finally:
        for store in opened:
            store.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema_name}" CASCADE')
        admin.dispose()


@pytest.fixture
def sqlite_store() -> Iterator[GlobalStore]:
    """A fresh in-memory SQLite store."""
    store = GlobalStore(create_store_engine("sqlite://"))
    store.create_schema()
    yield store
    store.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest) -> GlobalStore:
    """The same tests on embedded SQLite and on real PostgreSQL."""
    if request.param == "sqlite":
        sqlite: GlobalStore = request.getfixturevalue("sqlite_store")
        return sqlite
    stores: StoreFactory = request.getfixturevalue("postgres_stores")
    return stores()
