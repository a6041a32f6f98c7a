"""Stores for the global plane's tests: embedded SQLite always, real PostgreSQL when it runs.

Each PostgreSQL test gets a schema of its own (dropped afterwards), so runs
never see each other's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from llmmesh.globalplane.store import GlobalStore, create_store_engine

StoreFactory = Callable[[], GlobalStore]
"""Opens another store (its own engine and pool) on the same database."""


@pytest.fixture
def postgres_stores(postgres_schema_url: str) -> Iterator[StoreFactory]:
    """Opens stores on one fresh PostgreSQL schema; the first creates the tables."""
    opened: list[GlobalStore] = []

    def open_store() -> GlobalStore:
        store = GlobalStore(create_store_engine(postgres_schema_url))
        if not opened:
            store.create_schema()
        opened.append(store)
        return store

    try:
        yield open_store
    finally:
        for store in opened:
            store.dispose()


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
