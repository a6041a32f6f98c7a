"""The global plane's Prometheus metrics, served on its ``/metrics``.

Every series is named ``llmmesh_global_*``; labels are bounded (zones,
regions, methods, reasons).

- ``llmmesh_global_usage_records_total{outcome}``: usage records billing took:
  ``accepted`` (new) or ``duplicate`` (already billed).
- ``llmmesh_global_billing_lag_seconds``: seconds from a turn's end to billing receiving its record.
- ``llmmesh_global_policy_lookups_total{method,outcome}``: key authentications and policy
  snapshot reads; outcome ``ok``, ``not_modified`` or the refusal's reason.
- ``llmmesh_global_routing_decisions_total{zone,region}``: Route answers, by the
  tenant's zone and the region ranked first.
- ``llmmesh_global_routing_refusals_total{reason}``: Route calls refused (e.g. ``NO_REGION_IN_ZONE``).
- ``llmmesh_global_regions{zone,health}``: regions in the directory by zone and health.
- ``llmmesh_global_region_heartbeat_age_seconds{zone,region}``: seconds since the region's last heartbeat.

With them ``llmmesh_store_errors_total{store="global"}`` (:mod:`llmmesh.core.dependency_metrics`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from llmmesh.core import dependency_metrics
from llmmesh.core.errors import MeshError, Reason
from llmmesh.globalplane.region_directory import RegionDirectory, RegionHealth, RegionStatus
from llmmesh.v1 import billing_service_pb2

REGISTRY = CollectorRegistry()
dependency_metrics.register(REGISTRY, readiness=False)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0)
_READ_TRIES = 5

USAGE_RECORDS = Counter(
    "llmmesh_global_usage_records",
    "Usage records billing took: accepted (new) or duplicate",
    ["outcome"],
    registry=REGISTRY,
)
BILLING_LAG = Histogram(
    "llmmesh_global_billing_lag_seconds",
    "Seconds from a turn's end to billing receiving its usage record",
    buckets=LAG_BUCKETS,
    registry=REGISTRY,
)
POLICY_LOOKUPS = Counter(
    "llmmesh_global_policy_lookups",
    "Key authentications and policy snapshot reads, by method and outcome",
    ["method", "outcome"],
    registry=REGISTRY,
)
ROUTING_DECISIONS = Counter(
    "llmmesh_global_routing_decisions",
    "Route answers, by the tenant's zone and the region ranked first",
    ["zone", "region"],
    registry=REGISTRY,
)
ROUTING_REFUSALS = Counter(
    "llmmesh_global_routing_refusals", "Route calls refused, by reason", ["reason"], registry=REGISTRY
)
for _outcome in ("accepted", "duplicate"):
    USAGE_RECORDS.labels(_outcome)
# The refusal that matters most for residency: a zone with no region to serve it.
ROUTING_REFUSALS.labels(Reason.NO_REGION_IN_ZONE)


def usage_recorded(
    records: Sequence[billing_service_pb2.UsageRecord], accepted: int, duplicates: int, now: datetime
) -> None:
    """Billing took ``records`` at ``now``: ``accepted`` new, ``duplicates`` known."""
    USAGE_RECORDS.labels("accepted").inc(accepted)
    USAGE_RECORDS.labels("duplicate").inc(duplicates)
    for record in records:
        if record.HasField("end_time"):
            BILLING_LAG.observe(max(0.0, (now - record.end_time.ToDatetime(now.tzinfo)).total_seconds()))


@contextlib.asynccontextmanager
async def policy_lookup(method: str) -> AsyncIterator[Callable[[str], None]]:
    """Count one lookup: ``ok`` unless the body names another outcome (the
    yielded callable) or raises a MeshError (its reason)."""
    outcome = ["ok"]
    try:
        yield lambda named: outcome.__setitem__(0, named)
    except MeshError as err:
        POLICY_LOOKUPS.labels(method, err.reason).inc()
        raise
    POLICY_LOOKUPS.labels(method, outcome[0]).inc()


@contextlib.asynccontextmanager
async def routing_refusals() -> AsyncIterator[None]:
    """Count a Route call refused with a MeshError, by its reason."""
    try:
        yield
    except MeshError as err:
        ROUTING_REFUSALS.labels(err.reason).inc()
        raise


def routed(zone: str, regions: Sequence[RegionStatus]) -> None:
    ROUTING_DECISIONS.labels(zone, regions[0].report.region if regions else "").inc()


class DirectoryGauges:
    """Reads the region directories of the process at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._directories: dict[int, tuple[RegionDirectory, Callable[[], datetime]]] = {}

    def add(self, directory: RegionDirectory, clock: Callable[[], datetime]) -> None:
        with self._lock:
            self._directories[id(directory)] = (directory, clock)

    def remove(self, directory: RegionDirectory) -> None:
        with self._lock:
            self._directories.pop(id(directory), None)

    def collect(self) -> Iterator[Metric]:
        regions = GaugeMetricFamily(
            "llmmesh_global_regions", "Regions in the directory by zone and health", labels=["zone", "health"]
        )
        ages = GaugeMetricFamily(
            "llmmesh_global_region_heartbeat_age_seconds",
            "Seconds since the region's last heartbeat",
            labels=["zone", "region"],
        )
        with self._lock:
            directories = list(self._directories.values())
        for directory, clock in directories:
            statuses = _read(directory)
            now = clock()
            counts: dict[tuple[str, str], int] = {}
            for status in statuses:
                zone = status.report.zone
                for known in RegionHealth:
                    counts.setdefault((zone, known.name.lower()), 0)
                counts[zone, status.effective_health.name.lower()] += 1
                age = (now - status.last_heartbeat_time).total_seconds()
                ages.add_metric([zone, status.report.region], max(0.0, age))
            for (zone, health_name), count in sorted(counts.items()):
                regions.add_metric([zone, health_name], count)
        yield regions
        yield ages


def _read(directory: RegionDirectory) -> list[RegionStatus]:
    """Every region of ``directory``; the event loop may add one while the scrape reads."""
    for attempt in range(_READ_TRIES):
        try:
            statuses: list[RegionStatus] = []
            token = ""
            for _ in range(1000):
                page = directory.list_regions(page_size=100, page_token=token)
                statuses += page.items
                token = page.next_page_token
                if not token:
                    break
            return statuses
        except RuntimeError:
            if attempt == _READ_TRIES - 1:
                raise
    return []


DIRECTORIES = DirectoryGauges()
REGISTRY.register(DIRECTORIES)
