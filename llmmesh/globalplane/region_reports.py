"""Regions' last heartbeats in the global store.

The region directory answers from memory; every replica of the global
plane also writes each heartbeat it receives here (one row per region,
updated in place). Every replica reads them back each heartbeat interval
(:mod:`globalplane.directory_sync`), so it routes on the regions that
report to its peers, and a replica that was killed and restarted rebuilds
its directory from them (:meth:`RegionDirectory.restore`) and routes at
once, instead of answering ``NO_REGION_IN_ZONE`` until every region has
reported again. The heartbeat times come back with the reports: staleness
is still judged by heartbeat age.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.globalplane import schema
from llmmesh.globalplane.region_directory import LocationHint, ModelPodCount, RegionHealth, RegionReport
from llmmesh.globalplane.store import GlobalStore


def _row(report: RegionReport, heartbeat_time: datetime) -> dict[str, object]:
    location = report.location
    return {
        "region": report.region,
        "zone": report.zone,
        "chat_address": report.chat_address,
        "health": report.health.name,
        "capacity": report.capacity,
        "queue_depth": report.queue_depth,
        "models": list(report.models),
        "location": f"{location.latitude!r},{location.longitude!r}" if location is not None else None,
        "engine_pods": report.engine_pods,
        "healthy_engine_pods": report.healthy_engine_pods,
        "model_pods": [[m.model, m.engine_pods, m.healthy_engine_pods] for m in report.model_pods],
        "heartbeat_time": heartbeat_time,
    }


def _report(row: sa.Row[tuple[object, ...]]) -> tuple[RegionReport, datetime]:
    m = row._mapping
    located = LocationHint.parse(str(m["location"])).point if m["location"] else None
    report = RegionReport(
        region=str(m["region"]),
        zone=str(m["zone"]),
        chat_address=str(m["chat_address"]),
        health=RegionHealth[str(m["health"])],
        capacity=int(m["capacity"]),
        queue_depth=int(m["queue_depth"]),
        models=tuple(str(name) for name in m["models"]),
        location=located,
        engine_pods=int(m["engine_pods"]),
        healthy_engine_pods=int(m["healthy_engine_pods"]),
        model_pods=tuple(
            ModelPodCount(str(name), int(pods), int(healthy)) for name, pods, healthy in m["model_pods"] or ()
        ),
    )
    heartbeat_time: datetime = m["heartbeat_time"]
    return report, heartbeat_time


class RegionReportBook:
    """Writes, reads and deletes the regions' last heartbeats."""

    def __init__(self, store: GlobalStore) -> None:
        self._store = store

    async def save(self, report: RegionReport, heartbeat_time: datetime) -> None:
        """Keep ``report`` as the region's last heartbeat, in place of the one before."""
        t, row = schema.region_reports, _row(report, heartbeat_time)

        def write(conn: Connection) -> None:
            # Update, else insert: one statement pair that SQLite, PostgreSQL and CockroachDB all run.
            updated = conn.execute(sa.update(t).where(t.c.region == report.region).values(**row))
            if updated.rowcount == 0:
                conn.execute(sa.insert(t).values(**row))

        await self._store.grouped(write)

    async def load(self) -> list[tuple[RegionReport, datetime]]:
        """Every kept heartbeat, by region name."""
        t = schema.region_reports

        def read(conn: Connection) -> list[tuple[RegionReport, datetime]]:
            return [_report(row) for row in conn.execute(sa.select(t).order_by(t.c.region))]

        return await self._store.transaction(read)

    async def delete(self, region: str) -> bool:
        """Forget ``region``'s heartbeat; whether there was one."""
        t = schema.region_reports

        def write(conn: Connection) -> bool:
            return bool(conn.execute(sa.delete(t).where(t.c.region == region)).rowcount)

        return await self._store.transaction(write)
