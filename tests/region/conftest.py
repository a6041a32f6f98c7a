"""Fixtures of the region tests: a whole in-process mesh without an edge, and
one zone store shared between regions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.zone_store import ZoneStore
from tests.stack import Stack, running_stack


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    """A global plane, a simulator pod and a region, in process."""
    async with running_stack() as running:
        yield running


@pytest.fixture(params=["file", pytest.param("postgresql", marks=pytest.mark.services)])
def zone_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The zone store's URL: an SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "file":
        return f"sqlite:///{tmp_path / 'us.db'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


@pytest.fixture
def regions(zone_url: str) -> Iterator[tuple[ZoneStore, ZoneStore]]:
    """The zone store as us-east (where turns begin, or the region that
    failed) and us-west (where they are continued) use it."""
    stores = []
    for region in ("us-east", "us-west"):
        store = ZoneStore(create_store_engine(zone_url), "us", region)
        store.create_schema()
        stores.append(store)
    yield stores[0], stores[1]
    for store in stores:
        store.dispose()
