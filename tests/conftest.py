"""Fixtures shared by every test package.

Tests that need PostgreSQL or Redis take the ``postgres_url`` or
``redis_url`` fixture: it skips when the service is down, unless
``LLMMESH_REQUIRE_SERVICES=1`` (CI), where it fails instead.
"""

from __future__ import annotations

import os
import socket

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge correctness, not speed: a loaded CI machine must not
# turn a slow example into a failure.
settings.register_profile(
    "llmmesh",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("llmmesh")

POSTGRES_URL = os.environ.get(
    "LLMMESH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("LLMMESH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _need(service: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    message = f"{service} is not reachable at {host}:{port}"
    if os.environ.get("LLMMESH_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " and LLMMESH_REQUIRE_SERVICES=1")
    pytest.skip(message)


@pytest.fixture
def postgres_url() -> str:
    """A SQLAlchemy URL of the test PostgreSQL database."""
    _need("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL


@pytest.fixture
def redis_url() -> str:
    """A URL of the test Redis."""
    _need("Redis", "127.0.0.1", 6379)
    return REDIS_URL
