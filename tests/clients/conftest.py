"""Fixtures of the third-party client tests: the edge tests' in-process
mesh, one per module (each test makes its own requests and reads nothing
another leaves), and the base URL a client is pointed at. Each module runs
its tests in one event loop: ``pytestmark = pytest.mark.asyncio(loop_scope="module")``.

The clients' libraries are imported inside the tests, not at module level,
so collecting the suite does not pay for importing them."""

from __future__ import annotations

import pytest

from tests.edge.conftest import shared_stack
from tests.edge.sdk import base_url
from tests.stack import Stack

__all__ = ["edge_url", "shared_stack"]


@pytest.fixture(scope="module")
def edge_url(shared_stack: Stack) -> str:
    """The edge's OpenAI base URL (``http://host:port/v1``)."""
    return base_url(shared_stack)
