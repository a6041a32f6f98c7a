"""The edge's traffic buffer: events fall into their interval, only the last
``points`` intervals are kept, latency percentiles come from a bounded
sample, and a window reads every interval, empty ones included."""

from __future__ import annotations

import random

from llmmesh.edge import traffic_series
from llmmesh.edge.traffic_series import RegionLoad, TrafficSeries


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _series(clock: Clock, points: int = 6, reservoir: int = 64) -> TrafficSeries:
    return TrafficSeries(interval_s=10, points=points, reservoir=reservoir, clock=clock, rng=random.Random(7))


def test_events_fall_into_their_interval_and_empty_intervals_read_as_zero() -> None:
    clock = Clock(1000.0)
    series = _series(clock)
    series.turn_started("eu-west", "small")
    series.tokens("eu-west", "small", 30, None)
    clock.now = 1009.9
    series.turn_started("eu-west", "small")
    series.turn_failed("eu-west", "small", "rate_limit_exceeded")
    series.error_answered("invalid_api_key")
    clock.now = 1035.0
    series.tokens("eu-west", "small", 10, 0.5)

    view = series.window(40)
    assert view.timestamps == [1000, 1010, 1020, 1030]
    assert view.window_s == 40
    (row,) = view.series
    assert (row.region, row.model) == ("eu-west", "small")
    assert row.requests == [2, 0, 0, 0]
    assert row.errors == {"rate_limit_exceeded": [1, 0, 0, 0]}
    assert view.errors == {"invalid_api_key": [1, 0, 0, 0]}
    # A closed interval is rated over its 10 s, the one still filling over the 5 s gone by.
    assert row.output_tokens_per_s == [3.0, 0.0, 0.0, 2.0]
    assert row.itl_p50_s == [None, None, None, 0.05]


def test_only_the_last_points_are_kept() -> None:
    clock = Clock(0.0)
    series = _series(clock, points=6)
    for step in range(50):
        clock.now = step * 10.0
        series.turn_started("r", "m")
        series.region_load(
            "r", RegionLoad(queue_depth=step, capacity=8, healthy_engine_pods=2, engine_pods=2)
        )
    assert len(series._intervals) == 6
    view = series.window(3600)
    assert view.timestamps == [440, 450, 460, 470, 480, 490]
    assert view.series[0].requests == [1] * 6
    (load,) = view.regions
    assert load.queue_depth == [44, 45, 46, 47, 48, 49]
    # A window shorter than what is kept reads only its own intervals.
    assert series.window(20).timestamps == [480, 490]


def test_percentiles_of_a_bounded_sample() -> None:
    clock = Clock(100.0)
    series = _series(clock, reservoir=64)
    for value in range(1, 11):
        series.first_token("r", "m", value / 10)
    row = series.window(10).series[0]
    # Nearest rank over every value while they fit the reservoir.
    assert (row.ttft_p50_s, row.ttft_p90_s) == ([0.5], [0.9])

    clock.now = 110.0
    for value in range(10_000):
        series.first_token("r", "m", float(value))
    reservoir = series._intervals[-1].series[("r", "m")].ttft
    assert len(reservoir.values) == 64 and reservoir.seen == 10_000
    row = series.window(10).series[0]
    p50, p90 = row.ttft_p50_s[0], row.ttft_p90_s[0]
    assert p50 is not None and p90 is not None
    # A uniform sample of 0..9999: the quantiles land near the true ones.
    assert 3500 < p50 < 6500 and 8000 < p90 < 10_000 and p50 < p90


def test_a_clock_stepping_back_records_into_the_latest_interval() -> None:
    clock = Clock(500.0)
    series = _series(clock)
    series.turn_started("r", "m")
    clock.now = 480.0
    series.turn_started("r", "m")
    clock.now = 505.0
    assert series.window(10).series[0].requests == [2]


def test_tenants_seen_are_bounded_and_most_recent_first() -> None:
    clock = Clock(0.0)
    series = _series(clock, points=360)
    for n in range(traffic_series.MAX_TENANTS + 5):
        clock.now = float(n)
        series.tenant_seen(f"ten_{n}")
    clock.now = 200.0
    series.tenant_seen("ten_3")
    tenants = series.window(3600).tenants
    assert len(tenants) == traffic_series.MAX_TENANTS
    assert tenants[:2] == ["ten_3", f"ten_{traffic_series.MAX_TENANTS + 4}"]
    assert "ten_0" not in tenants
    # Outside the window, a tenant is not listed.
    clock.now = 3780.0
    assert series.window(3600).tenants == ["ten_3"]
