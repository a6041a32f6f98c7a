"""The readiness rule (llmmesh.core.readiness): a plane is ready when every
dependency it needs answers (one it degrades without is reported, not
required); one that is down says why, in the report, the
log and ``llmmesh_dependency_up``; the global plane counts as down only past
the grace a plane serves through its outages with; a hung probe is waited
on, not started again; and a store counts the failures that are the
database's (llmmesh_store_errors_total), not its callers'."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import pytest
import sqlalchemy as sa

from llmmesh.core.dependency_metrics import DEPENDENCY_UP, STORE_ERRORS
from llmmesh.core.readiness import (
    DependencyCheck,
    DependencyState,
    OutageGrace,
    ReadinessReport,
    ReadinessWatch,
)
from llmmesh.core.sqlstore import SqlStore, create_store_engine, failure_kind


def test_a_plane_is_ready_only_when_every_dependency_is_up() -> None:
    up = ReadinessReport((DependencyState("redis", True), DependencyState("global_plane", True)))
    assert up.ready
    assert up.reasons == []
    down = ReadinessReport(
        (DependencyState("redis", False, "connection refused"), DependencyState("x", True))
    )
    assert not down.ready
    assert down.reasons == ["redis: connection refused"]
    assert down.body() == {
        "status": "unavailable",
        "dependencies": {
            "redis": {"up": False, "required": True, "reason": "connection refused"},
            "x": {"up": True, "required": True, "reason": ""},
        },
    }


def test_a_dependency_the_plane_degrades_without_is_reported_but_keeps_it_ready() -> None:
    report = ReadinessReport(
        (DependencyState("redis", False, "connection refused", required=False), DependencyState("x", True))
    )
    assert report.ready
    assert report.reasons == ["redis: connection refused"]
    assert report.body()["status"] == "ok"


def test_an_outage_counts_only_past_its_grace() -> None:
    now = [100.0]
    grace = OutageGrace(30.0, clock=lambda: now[0])
    assert grace.reason(False) == ""
    now[0] += 30.0
    assert grace.reason(False) == ""
    now[0] += 1.0
    assert "unreachable for 31 s, past the 30 s" in grace.reason(False)
    # Reachable again: the next outage gets a whole grace.
    assert grace.reason(True) == ""
    now[0] += 1.0
    assert grace.reason(False) == ""


def _up(plane: str, dependency: str) -> float | None:
    for metric in DEPENDENCY_UP.collect():
        for sample in metric.samples:
            if sample.labels == {"plane": plane, "dependency": dependency}:
                return sample.value
    return None


@pytest.mark.asyncio
async def test_the_watch_reports_a_down_dependency_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmmesh.core.readiness")
    redis_reason = ["the zone's Redis does not answer: connection refused"]
    changes: list[bool] = []

    async def redis() -> str:
        return redis_reason[0]

    async def store() -> str:
        raise RuntimeError("database is gone")

    async def on_change(ready: bool) -> None:
        changes.append(ready)

    checks = [DependencyCheck("redis", redis), DependencyCheck("zone_store", store)]
    watch = ReadinessWatch("test-plane", checks, on_change=on_change)
    assert watch.report.ready  # until the first check
    report = await watch.check()
    assert not report.ready
    assert report.reasons == [
        "redis: the zone's Redis does not answer: connection refused",
        "zone_store: database is gone",
    ]
    assert changes == [False]
    assert _up("test-plane", "redis") == 0
    assert "test-plane not ready: redis is down: the zone's Redis" in caplog.text
    # Still down: no second change, no second log line.
    caplog.clear()
    await watch.check()
    assert changes == [False]
    assert "not ready" not in caplog.text
    redis_reason[0] = ""
    report = await watch.check()
    assert [d.name for d in report.dependencies if d.up] == ["redis"]
    assert _up("test-plane", "redis") == 1
    assert "redis is up again" in caplog.text
    await watch.close()
    assert _up("test-plane", "redis") is None


@pytest.mark.asyncio
async def test_a_hung_probe_is_down_and_waited_on_not_started_again() -> None:
    started = 0
    release = asyncio.Event()

    async def hung() -> str:
        nonlocal started
        started += 1
        await release.wait()
        return ""

    watch = ReadinessWatch("hung-plane", [DependencyCheck("zone_store", hung, timeout_s=0.05)])
    first = await watch.check()
    second = await watch.check()
    assert not first.ready and not second.ready
    assert second.reasons[0].startswith("zone_store: no answer for ")
    assert started == 1
    # Answered since: the next round asks afresh.
    release.set()
    assert (await watch.check()).ready
    await watch.close()


@pytest.mark.asyncio
async def test_a_ready_plane_tells_its_owner_once_and_fresh_reuses_a_recent_report() -> None:
    calls = 0
    changes: list[bool] = []

    async def fine() -> str:
        nonlocal calls
        calls += 1
        return ""

    async def on_change(ready: bool) -> None:
        changes.append(ready)

    watch = ReadinessWatch("fresh-plane", [DependencyCheck("redis", fine)], on_change=on_change)
    assert (await watch.fresh()).ready
    assert (await watch.fresh()).ready
    assert calls == 1
    assert changes == [True]
    await watch.close()


def _dbapi(error: type[sa.exc.DBAPIError], orig: Exception) -> sa.exc.DBAPIError:
    return error("SELECT 1", {}, orig)


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def test_a_store_counts_the_database_s_failures_not_its_callers() -> None:
    refused = _dbapi(sa.exc.OperationalError, _PgError("08006"))
    assert failure_kind(refused, retries_left=True) == "unavailable"
    conflict = _dbapi(sa.exc.OperationalError, _PgError("40001"))
    assert failure_kind(conflict, retries_left=True) is None
    assert failure_kind(conflict, retries_left=False) == "conflict"
    assert failure_kind(_dbapi(sa.exc.IntegrityError, _PgError("23505")), retries_left=True) is None
    # sqlite3 raises OperationalError for a bad statement too: not the database's failure.
    no_table = _dbapi(sa.exc.OperationalError, sqlite3.OperationalError("no such table: t"))
    assert failure_kind(no_table, retries_left=True) is None
    unopened = _dbapi(sa.exc.OperationalError, sqlite3.OperationalError("unable to open database file"))
    assert failure_kind(unopened, retries_left=True) == "unavailable"


def _store_errors(store: str, kind: str) -> float:
    for metric in STORE_ERRORS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels == {"store": store, "kind": kind}:
                return sample.value
    raise AssertionError(f"no series for {store}/{kind}")


class _ProbeStore(SqlStore):
    store_label = "probe-test"


@pytest.mark.asyncio
async def test_a_store_ping_fails_and_counts_when_its_database_cannot_be_opened(tmp_path: object) -> None:
    store = _ProbeStore(create_store_engine("sqlite://"))
    await store.ping()
    assert _store_errors("probe-test", "unavailable") == 0
    store.dispose()
    unopenable = _ProbeStore(sa.create_engine("sqlite:////nonexistent-dir/for/sure/store.db"))
    with pytest.raises(sa.exc.OperationalError):
        await unopenable.ping()
    assert _store_errors("probe-test", "unavailable") == 1
    assert _store_errors("probe-test", "conflict") == 0
    unopenable.dispose()
