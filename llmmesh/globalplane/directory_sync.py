"""One region directory per replica, kept in step through the global store.

A region's heartbeats travel on one gRPC (HTTP/2) connection, which the
global plane's Service balances to one replica; every replica writes the
heartbeats it receives to the store (:class:`RegionReportBook`) and reads
all of them back at least once a heartbeat interval
(:meth:`RegionDirectory.merge`). So a region heartbeating to one replica is
routed by every replica within an interval, and one that falls silent is
DOWN on every replica after the same ``missed_until_down`` intervals.
Routing still answers from memory: the store is read once an interval per
replica, not once a request.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import sqlalchemy as sa

from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.region_directory import RegionDirectory
from llmmesh.globalplane.region_reports import RegionReportBook

log = logging.getLogger(__name__)


class DirectorySync:
    """Merges the store's heartbeats into ``directory`` once an interval of ``clock``."""

    def __init__(self, directory: RegionDirectory, reports: RegionReportBook, clock: Clock = utc_now) -> None:
        self._directory = directory
        self._reports = reports
        self._clock = clock
        self._lock = asyncio.Lock()
        self._read_time: datetime | None = None

    @property
    def _interval(self) -> timedelta:
        return timedelta(milliseconds=self._directory.interval_ms)

    async def refresh(self) -> None:
        """Read every kept heartbeat and merge it in now.

        A failed read is logged and tried again an interval later: the
        directory meanwhile answers on what it holds, its own heartbeats
        included.
        """
        async with self._lock:
            await self._read()

    async def refresh_if_due(self) -> None:
        """:meth:`refresh` unless the store was read less than an interval ago.

        Concurrent callers share one read.
        """
        if not self._due():
            return
        async with self._lock:
            if self._due():
                await self._read()

    async def run(self) -> None:
        """Refresh every half interval (so a read path rarely finds one due) until cancelled."""
        while True:
            await self.refresh_if_due()
            await asyncio.sleep(self._directory.interval_ms / 2000)

    def _due(self) -> bool:
        return self._read_time is None or self._clock() - self._read_time >= self._interval

    async def _read(self) -> None:
        read_time = self._clock()
        self._read_time = read_time
        try:
            heartbeats = await self._reports.load()
        except sa.exc.SQLAlchemyError as err:
            log.warning("region heartbeats not read from the store: %s", err)
            return
        self._directory.merge(heartbeats, read_time)
