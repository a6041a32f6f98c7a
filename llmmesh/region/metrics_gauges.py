"""The region's scrape-time gauges: read from the running plane when
Prometheus scrapes, so they never lag it. The autoscaling signals per
engine pool (a pool is the region's pods serving one model) are here.

- ``llmmesh_region_info{region,zone}``: 1; join it ``on (instance)`` to break
  the region's own counters (which carry no region label) down by region and zone.
- ``llmmesh_region_queue_depth{region,pool}``: turns waiting for a batch slot
  at the pool's healthy pods (their last load reports).
- ``llmmesh_region_kv_usage_ratio{region,pool}``: mean KV-cache usage of the
  pool's healthy pods, 0 to 1.
- ``llmmesh_region_running{region,pool}``: turns in the batches of the pool's healthy pods.
- ``llmmesh_region_pool_pods{region,pool,state}``: pods of the pool, ``healthy`` or ``unhealthy``.
- ``llmmesh_region_admission_queue_depth{region,tier}``: turns waiting in the fair queue.
- ``llmmesh_region_admission_running{region}``: turns holding an admission slot.
- ``llmmesh_region_admission_capacity{region}``: admission slots (the pods' batch slots, overcommitted).
- ``llmmesh_region_usage_outbox_pending{region}``: usage records not yet accepted by billing.
- ``llmmesh_region_usage_outbox_oldest_age_seconds{region}``: age of the oldest of
  them (from its turn's end); 0 when none is pending.

The scrape runs on the endpoint's thread while the event loop changes
what it reads; a read that meets a dictionary mid-change is retried.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric

from llmmesh.core.metrics_http import MetricsEndpoint
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.fair_queue import FairQueue, tier_name
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.metrics import REGISTRY, OutboxReading
from llmmesh.region.placement.router import LoadBoard
from llmmesh.region.safety.verdict import ALL_CATEGORIES
from llmmesh.v1 import common_pb2

_READ_TRIES = 5
_POOL = ["region", "pool"]
KNOWN_TIERS = tuple(
    tier_name(tier) for tier in (common_pb2.TIER_FREE, common_pb2.TIER_PRO, common_pb2.TIER_ENTERPRISE)
)


@dataclass
class RegionReadings:
    """The parts of one running region that its gauges read."""

    region: str
    zone: str
    queue: FairQueue
    pool: EnginePool
    loads: LoadBoard
    outbox: OutboxReading = field(default_factory=OutboxReading)


@dataclass
class _PoolTotals:
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    healthy: int = 0
    unhealthy: int = 0


class RegionGauges:
    """One collector for every region plane of the process (tests run several)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, RegionReadings] = {}

    def add(self, readings: RegionReadings) -> None:
        with self._lock:
            self._regions[readings.region] = readings

    def remove(self, region: str) -> None:
        with self._lock:
            self._regions.pop(region, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            regions = list(self._regions.values())
        families = _families()
        for readings in regions:
            for attempt in range(_READ_TRIES):
                try:
                    samples = list(_samples(readings))
                    break
                except RuntimeError:  # a dict changed size while read
                    if attempt == _READ_TRIES - 1:
                        raise
            for name, labels, value in samples:
                families[name].add_metric(labels, value)
        return iter(families.values())


def _families() -> dict[str, GaugeMetricFamily]:
    specs = (
        ("llmmesh_region_info", "The region and its zone, always 1", ["region", "zone"]),
        ("llmmesh_region_queue_depth", "Turns waiting for a batch slot at the pool's pods", _POOL),
        ("llmmesh_region_kv_usage_ratio", "Mean KV-cache usage of the pool's healthy pods", _POOL),
        ("llmmesh_region_running", "Turns in the batches of the pool's healthy pods", _POOL),
        ("llmmesh_region_pool_pods", "Pods of the pool by state", ["region", "pool", "state"]),
        ("llmmesh_region_admission_queue_depth", "Turns waiting in the fair queue", ["region", "tier"]),
        ("llmmesh_region_admission_running", "Turns holding an admission slot", ["region"]),
        ("llmmesh_region_admission_capacity", "Admission slots of the region", ["region"]),
        ("llmmesh_region_usage_outbox_pending", "Usage records not yet accepted by billing", ["region"]),
        (
            "llmmesh_region_usage_outbox_oldest_age_seconds",
            "Age of the oldest usage record not yet accepted by billing",
            ["region"],
        ),
    )
    return {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in specs}


def _samples(readings: RegionReadings) -> Iterator[tuple[str, list[str], float]]:
    region = readings.region
    yield "llmmesh_region_info", [region, readings.zone], 1
    pools: dict[str, _PoolTotals] = {}
    for pod in readings.pool.pods:
        totals = pools.setdefault(pod.model or "unknown", _PoolTotals())
        if not pod.healthy:
            totals.unhealthy += 1
            continue
        totals.healthy += 1
        report = readings.loads.report(pod.pod_id)
        if report is not None:
            totals.waiting += report.waiting
            totals.running += report.running
            totals.kv_usage += report.kv_cache_usage
    for pool, totals in sorted(pools.items()):
        yield "llmmesh_region_queue_depth", [region, pool], totals.waiting
        yield "llmmesh_region_kv_usage_ratio", [region, pool], totals.kv_usage / max(1, totals.healthy)
        yield "llmmesh_region_running", [region, pool], totals.running
        yield "llmmesh_region_pool_pods", [region, pool, "healthy"], totals.healthy
        yield "llmmesh_region_pool_pods", [region, pool, "unhealthy"], totals.unhealthy
    stats = readings.queue.stats()
    for tier in sorted({*KNOWN_TIERS, *stats.waiting}):
        yield "llmmesh_region_admission_queue_depth", [region, tier], stats.waiting.get(tier, 0)
    yield "llmmesh_region_admission_running", [region], stats.running
    yield "llmmesh_region_admission_capacity", [region], stats.capacity
    outbox = readings.outbox
    yield "llmmesh_region_usage_outbox_pending", [region], outbox.pending
    oldest = outbox.oldest_end_s
    age = max(0.0, time.time() - oldest) if oldest is not None and outbox.pending else 0.0
    yield "llmmesh_region_usage_outbox_oldest_age_seconds", [region], age


GAUGES = RegionGauges()
REGISTRY.register(GAUGES)


def serve_region_metrics(readings: RegionReadings, host: str, port: int) -> MetricsEndpoint | None:
    """Start reading ``readings`` for the gauges, and serve the region's
    metrics on ``host:port`` (0 picks a port) unless ``port`` is negative."""
    GAUGES.add(readings)
    region_metrics.init_safety_categories(ALL_CATEGORIES)
    return MetricsEndpoint(REGISTRY, host, port) if port >= 0 else None
