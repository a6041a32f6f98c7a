"""The overhead benchmark's per-hop figures: percentiles read off histogram
buckets as ``histogram_quantile`` reads them, a round's hops as the
difference of two scrapes, the groups summed beside the client-side
figure, and each process's CPU time per output token."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmmesh.bench.overhead_hops import (
    CLIENT,
    HopSnapshot,
    bucket_quantile,
    cpu_seconds,
    parse_hops,
    parse_steps,
)
from llmmesh.core.hop_timing import HopStamps, hop_histogram
from llmmesh.engine.sim.metrics import SchedulerStats, SimStepsCollector

INF = math.inf


def test_a_quantile_is_interpolated_in_the_bucket_that_holds_its_rank() -> None:
    bounds, cumulative = (0.001, 0.002, 0.005, INF), (2.0, 6.0, 10.0, 10.0)
    assert bucket_quantile(0.5, bounds, cumulative) == pytest.approx(0.00175)  # rank 5: 3 of 4 in (1, 2] ms
    assert bucket_quantile(0.1, bounds, cumulative) == pytest.approx(0.0005)  # from 0 in the first bucket
    assert bucket_quantile(1.0, bounds, cumulative) == pytest.approx(0.005)
    assert bucket_quantile(0.5, bounds, (0.0, 0.0, 0.0, 0.0)) is None
    # A rank past the last finite bound reads as that bound.
    assert bucket_quantile(0.99, bounds, (0.0, 0.0, 1.0, 10.0)) == 0.005
    with pytest.raises(ValueError, match="between 0 and 1"):
        bucket_quantile(1.5, bounds, cumulative)


def scrape(registry: CollectorRegistry, plane: str) -> HopSnapshot:
    return HopSnapshot(parse_hops(plane, generate_latest(registry).decode()))


def test_a_round_is_the_difference_of_two_scrapes_and_its_groups_add_up() -> None:
    edge_registry, region_registry, engine_registry = (
        CollectorRegistry(),
        CollectorRegistry(),
        CollectorRegistry(),
    )
    edge = hop_histogram("llmmesh_edge_hop_seconds", "edge", "", edge_registry)
    region = hop_histogram("llmmesh_region_hop_seconds", "region", "", region_registry)
    engine = hop_histogram("llmmesh_engine_hop_seconds", "pod", "", engine_registry)
    edge.labels(hop="edge_in").observe(0.5)  # before the round: left out

    def snapshot() -> HopSnapshot:
        return (
            scrape(edge_registry, "edge")
            + scrape(region_registry, "region")
            + scrape(engine_registry, "engine")
        )

    before = snapshot()
    clock = iter([0.0, 0.0002, 0.0102, 0.0104])  # start, edge_in, region, edge_out
    stamps = HopStamps(clock=lambda: next(clock))
    for hop in ("edge_in", "region", "edge_out"):
        stamps.stamp(hop)
    stamps.observe(edge)
    stamps.observe(edge)  # once per turn
    for hop, seconds in (
        ("prepare", 0.0003),
        ("store_accept", 0.001),
        ("route", 0.0001),
        ("pod_send", 0.0005),
        ("pod_first_delta", 0.008),
    ):
        region.labels(hop=hop).observe(seconds)
    engine.labels(hop="queue").observe(0.002)
    engine.labels(hop="first_token").observe(0.005)

    table = (snapshot() - before).table(client_added_mean_ms=2.5)
    rows = {(row["plane"], row["hop"]): row for row in table["hops"]}
    assert rows[("edge", "edge_in")]["turns"] == 1 and rows[("edge", "edge_in")]["mean_ms"] == pytest.approx(
        0.2
    )
    assert rows[("region", "store_accept")]["group"] == "store"
    assert [key[0] for key in rows] == ["edge"] * 3 + ["region"] * 5 + ["engine"] * 2
    groups = table["groups_mean_ms"]
    assert groups["edge"] == pytest.approx(0.4)  # edge_in + edge_out
    assert groups["region"] == pytest.approx(0.3 + 0.5) and groups["router"] == pytest.approx(0.1)
    assert groups["edge_region_transport"] == pytest.approx(
        10.0 - 9.9
    )  # the edge's wait less the region's time
    # The region's wait after sending the start, less the pod's time: the send is counted once.
    assert groups["region_pod_transport"] == pytest.approx(8.0 - 7.0)
    assert groups["pod"] == pytest.approx(7.0)
    # The groups add up to the edge's whole time less the pod's: nothing counted twice.
    assert table["mesh_hops_sum_mean_ms"] == pytest.approx(0.4 + 0.8 + 1.0 + 0.1 + 0.1 + 1.0)
    assert table["mesh_hops_sum_mean_ms"] == pytest.approx((0.2 + 10.0 + 0.2) - 7.0)
    assert table["unaccounted_mean_ms"] == pytest.approx(2.5 - 3.4)

    # Direct's calls to the same pod: the pod's time through the mesh less
    # direct's is part of what the mesh adds, and of the sum.
    direct_registry = CollectorRegistry()
    direct_pod = hop_histogram("llmmesh_engine_hop_seconds", "pod", "", direct_registry)
    direct_pod.labels(hop="queue").observe(0.001)
    direct_pod.labels(hop="first_token").observe(0.0045)
    with_direct = (snapshot() - before).table(2.5, scrape(direct_registry, "engine"))
    assert with_direct["groups_mean_ms"]["pod_vs_direct"] == pytest.approx(7.0 - 5.5)
    assert with_direct["mesh_hops_sum_mean_ms"] == pytest.approx(3.4 + 1.5)
    assert with_direct["unaccounted_mean_ms"] == pytest.approx(2.5 - 4.9)


def test_the_pods_steps_of_a_round_and_those_that_prefilled_are_counted_apart() -> None:
    counts = {"steps": 10, "prefill_steps": 1}
    pod = CollectorRegistry()
    pod.register(SimStepsCollector(lambda: SchedulerStats(0, 0, 0.0, 0, 0, 0, **counts)))

    def snapshot() -> HopSnapshot:
        return HopSnapshot(steps=parse_steps(generate_latest(pod).decode()))

    before = snapshot()
    counts.update(steps=210, prefill_steps=13)  # a round: 200 steps, 12 of them prefilling
    mesh = snapshot() - before
    counts.update(steps=410, prefill_steps=19)  # direct's round on the same pod: 6 of 200
    direct = snapshot() - (before + mesh)
    table = mesh.table(1.0, direct)
    assert table["pod_steps"] == {"steps": 200, "prefill_steps": 12, "prefill_steps_per_100": 6.0}
    assert table["direct_pod_steps"] == {"steps": 200, "prefill_steps": 6, "prefill_steps_per_100": 3.0}
    # A pod that is no simulator counts no steps.
    assert HopSnapshot().table(1.0)["pod_steps"] is None


def test_a_rounds_cpu_per_output_token_is_its_processes_cpu_over_the_tokens_delivered() -> None:
    def at(tokens: int, **cpu_s: float) -> HopSnapshot:
        return HopSnapshot(cpu_s=cpu_s, output_tokens=tokens)

    start = at(0, edge=1.0, region=2.0, engine=3.0, client=5.0)
    first = at(1000, edge=1.1, region=2.3, engine=3.1, client=5.2) - start
    second = at(3000, edge=1.5, region=3.1, engine=3.3, client=5.6) - at(
        1000, edge=1.1, region=2.3, engine=3.1, client=5.2
    )
    rounds = first + second  # 3000 tokens: edge 0.5 s, region 1.1 s, engine 0.3 s, client 0.6 s
    direct = at(3000, engine=0.15, client=0.3) - at(0, engine=0.0, client=0.0)
    table = rounds.table(1.0, direct)
    assert table["cpu_us_per_token"] == pytest.approx(
        {"edge": 166.67, "region": 366.67, "engine": 100.0, CLIENT: 200.0, "total": 633.33}, abs=0.01
    )
    assert table["direct_cpu_us_per_token"] == pytest.approx({"engine": 50.0, CLIENT: 100.0, "total": 50.0})
    # The serving processes' totals: the clients (an HTTP one, a gRPC one) are not the path's cost.
    assert table["cpu_ratio"] == pytest.approx(633.33 / 50.0, abs=0.01)
    # A process read only at one end of a round is left out; no token, no figure.
    assert (at(10, edge=2.0, region=1.0) - at(0, edge=1.0)).cpu_s == {"edge": 1.0}
    assert at(0, edge=1.0).cpu_us_per_token() is None
    assert at(10, client=1.0).cpu_us_per_token() is None
    assert HopSnapshot().table(1.0)["cpu_ratio"] is None


# Spends 0.3 s of CPU, says so, then waits for its stdin to close.
BUSY = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print(flush=True)
sys.stdin.read()
"""
NO_PID = 2**22 + 1
"""Above Linux's highest process id (``pid_max`` is at most 2**22)."""


def test_cpu_time_is_read_per_process_and_a_process_gone_is_left_out() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as busy:
        try:
            assert busy.stdout is not None and busy.stdout.readline() == b"\n"
            mine = time.process_time()
            read = cpu_seconds({"busy": busy.pid, "gone": NO_PID})
        finally:
            busy.kill()
    assert set(read) == {"busy", CLIENT}
    assert read["busy"] >= 0.25 and read[CLIENT] >= mine
