"""Fixtures of the edge tests: a whole in-process mesh with its edge, and an
HTTP client on the edge."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from tests.stack import Stack, running_stack


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(with_edge=True) as running:
        yield running


@pytest_asyncio.fixture
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
        yield client
