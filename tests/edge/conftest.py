"""Fixtures of the edge tests: a whole in-process mesh with its edge, and an
HTTP client on the edge; fresh for each test, or (``shared_stack``,
``shared_http``) one per module, for modules whose tests leave nothing
another test reads (each makes its own conversations, or is refused). Such
a module runs its tests in one event loop:
``pytestmark = pytest.mark.asyncio(loop_scope="module")``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from tests.stack import SHARED_STACK_GLOBAL, Stack, running_stack


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(with_edge=True) as running:
        yield running


@pytest_asyncio.fixture
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_stack() -> AsyncIterator[Stack]:
    async with running_stack(with_edge=True, global_overrides=SHARED_STACK_GLOBAL) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_http(shared_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    assert shared_stack.edge is not None
    async with httpx.AsyncClient(base_url=shared_stack.edge.url, timeout=30) as client:
        yield client
