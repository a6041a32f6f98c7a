"""Fixtures shared by every test package.

Tests that need PostgreSQL or Redis take the ``postgres_url`` or
``redis_url`` fixture: it skips when the service is down, unless
``LLMMESH_REQUIRE_SERVICES=1`` (CI), where it fails instead.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmmesh.core import tracing

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


@contextmanager
def fresh_schema(postgres_url: str) -> Iterator[str]:
    """A URL whose connections use a new schema of the test database,
    dropped afterwards, so runs never see each other's rows."""
    schema = f"llmmesh_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{postgres_url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """:func:`fresh_schema` for one test."""
    with fresh_schema(postgres_url) as url:
        yield url


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process traces (:mod:`llmmesh.tracing`) into an in-memory
    exporter for the test; servers and channels made meanwhile trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
