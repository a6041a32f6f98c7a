"""Fixtures shared by every test package.

Tests that need PostgreSQL or Redis take the ``postgres_url`` or
``redis_url`` fixture: it skips when the service is down, unless
``LLMMESH_REQUIRE_SERVICES=1`` (CI), where it fails instead.

Every test under ``tests/e2e``, ``tests/bench`` and ``tests/vllm`` (real
processes, benchmark runs, vLLM) is ``slow``, as are the few marked so
elsewhere; ``pytest -m "not slow"`` is the fast lane.

Tests marked ``image`` build the container image: they run only when asked
for (``pytest -m image``, or ``LLMMESH_IMAGE_TESTS=1``), and then fail
rather than skip without a container engine. Otherwise they are deselected
and the run's summary names them as not run.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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

# The vLLM-CPU engines the tests start share two cores with the other
# workers: OpenMP threads that finish a parallel region sleep at once
# instead of spinning for the next one, leaving those cores to the rest.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_NOT_RUN = pytest.StashKey[list[str]]()


def _image_tests_asked_for(config: pytest.Config) -> bool:
    return os.environ.get("LLMMESH_IMAGE_TESTS") == "1" or "image" in (config.option.markexpr or "").replace(
        "not image", ""
    )


SLOW_FOLDERS = ("e2e", "bench", "vllm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
    if _image_tests_asked_for(config):
        return
    held = [item for item in items if item.get_closest_marker("image") is not None]
    if held:
        items[:] = [item for item in items if item.get_closest_marker("image") is None]
        config.hook.pytest_deselected(items=held)
    config.stash[_NOT_RUN] = [item.nodeid for item in held]
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: its controller prints the summary
        worker_output["not_run"] = config.stash[_NOT_RUN]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller hears what a worker left out when the worker ends."""
    output = getattr(node, "workeroutput", {})
    config = getattr(node, "config", None)
    if config is not None and output.get("not_run"):
        known = config.stash.get(_NOT_RUN, [])
        config.stash[_NOT_RUN] = sorted({*known, *output["not_run"]})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` hands out the longest file first (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.scheduling import LongestFileFirst

    return LongestFileFirst(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    held = config.stash.get(_NOT_RUN, [])
    if held:
        terminalreporter.section("not run", sep="-")
        for nodeid in held:
            terminalreporter.line(
                f"NOT RUN {nodeid}: builds the container image; run it with `pytest -m image`"
            )


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
    """This process traces (:mod:`llmmesh.core.tracing`) into an in-memory
    exporter for the test; servers and channels made meanwhile trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
