"""What this edge has seen over the last hour, in fixed intervals, for the
operator page's charts (``GET /ops/api/timeseries``).

Per region and model, each interval (``INTERVAL_S``) holds the turns that
started, the turns that ended in an error (by OpenAI error code), output
tokens, and a fixed-size reservoir of time-to-first-token and inter-token
samples, so its p50/p90 cost bounded memory however busy the edge is.
Edge-wide, it holds the error answers the edge gave (by code), and per
region the load its last heartbeat reported (sampled by
:class:`RegionLoadSampler`). Only the last ``POINTS`` intervals are kept:
memory is bounded by regions x models x ``RESERVOIR`` x ``POINTS``.

The edge records into one process-wide :data:`TRAFFIC`, as it does into
its Prometheus registry (:mod:`edge.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from llmmesh.core.errors import MeshError
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.v1 import geo_routing_service_pb2

log = logging.getLogger(__name__)

INTERVAL_S = 10
"""Seconds per sample."""
POINTS = 360
"""Intervals kept: one hour."""
RESERVOIR = 64
"""Latency samples kept per series and interval."""
MAX_TENANTS = 100
"""Tenants remembered as recently seen (the least recent is forgotten first)."""


class _Reservoir:
    """A uniform sample of at most ``size`` values (Vitter's algorithm R)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self._size = size
        self._rng = rng
        self.values: list[float] = []
        self.seen = 0

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self._size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self._size:
            self.values[slot] = value

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile of the sample; None when empty."""
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class _SeriesInterval:
    ttft: _Reservoir
    itl: _Reservoir
    requests: int = 0
    output_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class RegionLoad:
    """A region's load as its last heartbeat reported it."""

    queue_depth: int
    capacity: int
    healthy_engine_pods: int
    engine_pods: int


@dataclass
class _Interval:
    start: int
    series: dict[tuple[str, str], _SeriesInterval] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    regions: dict[str, RegionLoad] = field(default_factory=dict)


class SeriesView(BaseModel):
    """One region and model; every list has one entry per timestamp."""

    region: str
    model: str
    requests: list[int] = Field(description="Turns started.")
    errors: dict[str, list[int]] = Field(description="Turns that ended in an error, by OpenAI error code.")
    output_tokens_per_s: list[float]
    ttft_p50_s: list[float | None] = Field(description="Time to first token from the request's arrival.")
    ttft_p90_s: list[float | None]
    itl_p50_s: list[float | None] = Field(description="Inter-token latency: a delta's gap over its tokens.")


class RegionLoadView(BaseModel):
    """A region's reported load at each timestamp (null: no report then)."""

    region: str
    queue_depth: list[int | None]
    capacity: list[int | None]
    healthy_engine_pods: list[int | None]
    engine_pods: list[int | None]


class TimeSeriesView(BaseModel):
    """``GET /ops/api/timeseries``: this edge's traffic, interval by interval."""

    object: str = "ops.timeseries"
    interval_s: int
    window_s: int
    timestamps: list[int] = Field(
        description="Each interval's start, Unix seconds; the last is still filling."
    )
    series: list[SeriesView]
    errors: dict[str, list[int]] = Field(description="Error answers of the edge (refusals too), by code.")
    regions: list[RegionLoadView]
    tenants: list[str] = Field(description="Tenants this edge served in the window, most recent first.")


class TrafficSeries:
    """The last ``points`` intervals of ``interval_s`` seconds (see the module docstring)."""

    def __init__(
        self,
        *,
        interval_s: int = INTERVAL_S,
        points: int = POINTS,
        reservoir: int = RESERVOIR,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.points = points
        self._reservoir = reservoir
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._intervals: deque[_Interval] = deque(maxlen=points)
        self._tenants: OrderedDict[str, float] = OrderedDict()

    def _now(self) -> _Interval:
        start = int(self._clock() // self.interval_s) * self.interval_s
        # A clock that steps back records into the latest interval.
        if not self._intervals or self._intervals[-1].start < start:
            self._intervals.append(_Interval(start))
        return self._intervals[-1]

    def _series(self, region: str, model: str) -> _SeriesInterval:
        series = self._now().series
        key = (region, model)
        if key not in series:
            series[key] = _SeriesInterval(
                _Reservoir(self._reservoir, self._rng), _Reservoir(self._reservoir, self._rng)
            )
        return series[key]

    def turn_started(self, region: str, model: str) -> None:
        self._series(region, model).requests += 1

    def first_token(self, region: str, model: str, seconds: float) -> None:
        self._series(region, model).ttft.add(seconds)

    def tokens(self, region: str, model: str, count: int, gap_s: float | None) -> None:
        """``count`` output tokens arrived, ``gap_s`` after the turn's previous ones (None: the first)."""
        series = self._series(region, model)
        series.output_tokens += count
        if gap_s is not None and count > 0:
            series.itl.add(gap_s / count)

    def turn_failed(self, region: str, model: str, code: str) -> None:
        self._series(region, model).errors[code] += 1

    def error_answered(self, code: str) -> None:
        self._now().errors[code] += 1

    def tenant_seen(self, tenant_id: str) -> None:
        self._tenants[tenant_id] = self._clock()
        self._tenants.move_to_end(tenant_id)
        while len(self._tenants) > MAX_TENANTS:
            self._tenants.popitem(last=False)

    def region_load(self, region: str, load: RegionLoad) -> None:
        self._now().regions[region] = load

    def window(self, seconds: int) -> TimeSeriesView:
        """The intervals of the last ``seconds`` (at most ``points``), empty ones included."""
        now = self._clock()
        last = int(now // self.interval_s) * self.interval_s
        count = max(1, min(self.points, math.ceil(seconds / self.interval_s)))
        starts = [last - self.interval_s * i for i in range(count - 1, -1, -1)]
        held = {interval.start: interval for interval in self._intervals if interval.start >= starts[0]}
        rows = [held.get(start) for start in starts]
        # The interval still filling is rated over the part of it gone by.
        spans = [float(self.interval_s)] * (count - 1) + [max(1.0, now - last)]
        keys = sorted({key for row in rows if row is not None for key in row.series})
        series = [_series_view(key, rows, spans) for key in keys]
        regions = sorted({name for row in rows if row is not None for name in row.regions})
        since = starts[0]
        return TimeSeriesView(
            interval_s=self.interval_s,
            window_s=count * self.interval_s,
            timestamps=starts,
            series=series,
            errors=_counts([None if row is None else row.errors for row in rows]),
            regions=[_load_view(name, rows) for name in regions],
            tenants=[tenant for tenant, seen in reversed(self._tenants.items()) if seen >= since],
        )


def _counts(rows: list[Counter[str] | None]) -> dict[str, list[int]]:
    codes = sorted({code for row in rows if row is not None for code in row})
    return {code: [0 if row is None else row[code] for row in rows] for code in codes}


def _series_view(key: tuple[str, str], rows: list[_Interval | None], spans: list[float]) -> SeriesView:
    cells = [None if row is None else row.series.get(key) for row in rows]

    def quantile(cell: _SeriesInterval | None, reservoir: str, q: float) -> float | None:
        value = None if cell is None else getattr(cell, reservoir).quantile(q)
        return None if value is None else round(value, 6)

    return SeriesView(
        region=key[0],
        model=key[1],
        requests=[0 if c is None else c.requests for c in cells],
        errors=_counts([None if c is None else c.errors for c in cells]),
        output_tokens_per_s=[
            0.0 if c is None else round(c.output_tokens / span, 3)
            for c, span in zip(cells, spans, strict=True)
        ],
        ttft_p50_s=[quantile(c, "ttft", 0.5) for c in cells],
        ttft_p90_s=[quantile(c, "ttft", 0.9) for c in cells],
        itl_p50_s=[quantile(c, "itl", 0.5) for c in cells],
    )


def _load_view(region: str, rows: list[_Interval | None]) -> RegionLoadView:
    loads = [None if row is None else row.regions.get(region) for row in rows]
    return RegionLoadView(
        region=region,
        queue_depth=[None if x is None else x.queue_depth for x in loads],
        capacity=[None if x is None else x.capacity for x in loads],
        healthy_engine_pods=[None if x is None else x.healthy_engine_pods for x in loads],
        engine_pods=[None if x is None else x.engine_pods for x in loads],
    )


TRAFFIC = TrafficSeries()
"""This edge's traffic."""


class TurnTraffic:
    """One turn's share of :data:`TRAFFIC`: it counts the turn as started,
    then its first token (from ``arrived_s``, ``time.monotonic()``), the
    gaps between its deltas, and its error, under the region serving it."""

    def __init__(self, model: str, region: str, arrived_s: float, series: TrafficSeries = TRAFFIC) -> None:
        self._series = series
        self._model = model
        self._arrived_s = arrived_s
        self._last_s: float | None = None
        series.turn_started(region, model)

    def delta(self, region: str, tokens: int) -> None:
        now = time.monotonic()
        if self._last_s is None:
            self._series.first_token(region, self._model, now - self._arrived_s)
        self._series.tokens(region, self._model, tokens, None if self._last_s is None else now - self._last_s)
        self._last_s = now

    def failed(self, region: str, code: str | None) -> None:
        """The turn ended with the mesh's error ``code`` (OpenAI's)."""
        self._series.turn_failed(region, self._model, code or "unknown")


class RegionLoadSampler:
    """Samples every region's reported load from the global plane's
    directory into ``series`` each interval, while running."""

    def __init__(
        self,
        list_regions: Callable[[], Awaitable[list[geo_routing_service_pb2.RegionStatus]]],
        series: TrafficSeries = TRAFFIC,
    ) -> None:
        self._list_regions = list_regions
        self._series = series
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="region-load-sampler")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def sample(self) -> None:
        for status in await self._list_regions():
            report = status.report
            self._series.region_load(
                report.region,
                RegionLoad(
                    queue_depth=report.queue_depth,
                    capacity=report.capacity,
                    healthy_engine_pods=report.healthy_engine_pods,
                    engine_pods=report.engine_pods,
                ),
            )

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except MeshError as err:
                log.debug("region load not sampled: %s", err.message)
            await asyncio.sleep(self._series.interval_s)
