"""Where the mesh's added time to first token goes, hop by hop, for
``llmmesh bench overhead``.

Every plane observes each turn's hops on the way to its first token into a
Prometheus histogram (:mod:`llmmesh.core.hop_timing`:
``llmmesh_edge_hop_seconds``, ``llmmesh_region_hop_seconds``,
``llmmesh_engine_hop_seconds``, by ``hop``). The benchmark scrapes the
planes' ``/metrics`` before and after each measured round of a mesh and
keeps the difference: the round's turns alone (warm-up and the round's
first request, sent before the first scrape, are left out).

Per hop it reports the turns counted, the mean (exact: the histogram's sum
over its count) and the 50th and 99th percentiles read off the buckets as
Prometheus's ``histogram_quantile`` reads them: the bucket holding the
rank, linearly interpolated between its bounds (0 below the first), the
highest finite bound when the rank falls in ``+Inf``. With buckets of 0.1
ms to 1 s spaced by about 1.5x, such a percentile is within its bucket's
width of the true one.

Hops are grouped into what the mesh adds: ``edge`` (its own work before
the start goes out and after the first delta comes back), ``region``
(the gateway's stages: authentication, prompt, admission, the start sent
to the pod), ``safety`` (the input check and the output filter's hold of
the first delta), ``store`` (the zone store's acceptance and its
request-id hold), ``router``; and the two transports, known only as
means: edge to region and back (the edge's wait for the first delta less
the region's whole time) and region to pod and back (the region's wait for
the pod's first delta after it sent the start, less the request-id hold in
it, less the pod's whole time). The pod's own hops (``pod``: its prepare, queue and first
token) are what direct pays too. The request-id hold runs while the pod
works on the first token, so it delays the first delta only by what it
outlasts that work by; where it does, the region-to-pod transport comes out
that much smaller (it may come out negative).

Direct's calls go to the same pod, which times them the same way; the
pod's own time through the mesh less direct's (``pod_vs_direct``: a
request arriving at another point of the pod's step cycle, a batch of
another size) is part of what the mesh adds as the client sees it.

Each round also reads the CPU time (user and system, from ``/proc``) of
every process of the system (``edge``, ``region``, ``engine``, ``global``;
direct's, its pod) and of the benchmark's own process, its client
(``client``), just before and after it. Per output token delivered
(``cpu_us_per_token``, with the ``total`` of the serving processes, the
client left out; beside direct's, and the one total over the other as
``cpu_ratio``), that is what the path costs whatever the machine's
scheduling does to its latency: on a machine with fewer cores than
processes, the cost of every token is what decides how far the mesh's
latency stretches under load, and it changes less from run to run than
the latency does.

Their sum, in means, set beside the client-side figure (the mesh's mean
time to first token less direct's) leaves ``unaccounted``: what no plane
stamps (the client's HTTP leg to the edge and the reading of its first
chunk, against direct's one gRPC leg to the pod) and the scrapes' own
resolution. Means add up; percentiles do not, so the groups and the
comparison are in means.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmmesh.edge.metrics import EDGE_HOPS
from llmmesh.engine.hop_metrics import ENGINE_HOPS
from llmmesh.region.metrics import REGION_HOPS

PLANE_FAMILIES = {
    "edge": "llmmesh_edge_hop_seconds",
    "region": "llmmesh_region_hop_seconds",
    "engine": "llmmesh_engine_hop_seconds",
}
# Each hop's group in the report; a hop not listed is in "other".
GROUPS: Mapping[tuple[str, str], str] = {
    ("edge", "edge_in"): "edge",
    ("edge", "edge_out"): "edge",
    ("region", "prepare"): "region",
    ("region", "prompt"): "region",
    ("region", "admission"): "region",
    ("region", "pod_send"): "region",
    ("region", "safety_input"): "safety",
    ("region", "output_filter"): "safety",
    ("region", "store_accept"): "store",
    ("region", "request_id_hold"): "store",
    ("region", "route"): "router",
    ("engine", "prepare"): "pod",
    ("engine", "queue"): "pod",
    ("engine", "first_token"): "pod",
}
# What the mesh adds, in the order reported; "pod" is the pod's own time.
MESH_GROUPS = (
    "edge",
    "region",
    "safety",
    "store",
    "router",
    "edge_region_transport",
    "region_pod_transport",
    "pod_vs_direct",
)
_EDGE_WAIT = ("edge", "region")
# The region's wait for the pod once its start is sent (pod_send is the region's own work).
_POD_WAIT = ("pod_first_event", "request_id_hold", "pod_first_delta")


@dataclass(frozen=True)
class HopHistogram:
    """One hop's histogram: cumulative counts at each upper bound (the last
    ``inf``), the count and the sum of seconds."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum_s: float

    def __add__(self, other: HopHistogram) -> HopHistogram:
        return self._combine(other, 1.0)

    def __sub__(self, other: HopHistogram) -> HopHistogram:
        return self._combine(other, -1.0)

    def _combine(self, other: HopHistogram, sign: float) -> HopHistogram:
        if other.bounds != self.bounds:
            raise ValueError("histograms of different buckets")
        return HopHistogram(
            self.bounds,
            tuple(a + sign * b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.count + sign * other.count,
            self.sum_s + sign * other.sum_s,
        )

    @property
    def mean_s(self) -> float | None:
        return self.sum_s / self.count if self.count > 0 else None

    def quantile_s(self, q: float) -> float | None:
        """The ``q`` quantile (0 to 1) as ``histogram_quantile`` reads it (see the module docstring)."""
        return bucket_quantile(q, self.bounds, self.cumulative)


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The ``q`` quantile of a histogram's cumulative bucket counts at upper
    ``bounds`` (ascending, the last ``inf``): linear within the bucket that
    holds rank ``q * total``, from 0 for the first; the highest finite bound
    for a rank in ``+Inf``. None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("a quantile is between 0 and 1")
    if not cumulative or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    for index, (bound, below) in enumerate(zip(bounds, cumulative, strict=True)):
        if below >= rank and below > 0:
            if math.isinf(bound):
                return bounds[index - 1] if index > 0 else None
            lower = bounds[index - 1] if index > 0 else 0.0
            before = cumulative[index - 1] if index > 0 else 0.0
            in_bucket = below - before
            if in_bucket <= 0:
                return bound
            return lower + (bound - lower) * (rank - before) / in_bucket
    return None


HopKey = tuple[str, str]


STEP_FAMILIES = {"steps": "llmmesh_sim_steps", "prefill_steps": "llmmesh_sim_prefill_steps"}
"""The simulator pod's step counters (:mod:`llmmesh.engine.sim.metrics`), by what they count."""


class PodSteps(TypedDict):
    """The steps a simulator pod ran while one system's rounds were measured."""

    steps: int
    prefill_steps: int
    prefill_steps_per_100: float | None


class HopTable(TypedDict):
    """The report's per-hop figures of one mesh at one level (:meth:`HopSnapshot.table`);
    ``pod_steps`` and ``direct_pod_steps``, the steps of its pod and of the
    direct system's (where the pod is the simulator): every step that
    prefills costs the simulator's prefill overhead, so starts that reach the
    pod spread over more steps cost throughput. ``cpu_us_per_token`` and
    ``direct_cpu_us_per_token``: each process's CPU time per output token
    (and the ``total`` of the serving ones), ``cpu_ratio`` the one total
    over the other (None where a figure is missing)."""

    hops: list[dict[str, object]]
    groups_mean_ms: dict[str, float]
    mesh_hops_sum_mean_ms: float
    client_added_ttft_mean_ms: float | None
    unaccounted_mean_ms: float | None
    pod_steps: PodSteps | None
    direct_pod_steps: PodSteps | None
    cpu_us_per_token: dict[str, float] | None
    direct_cpu_us_per_token: dict[str, float] | None
    cpu_ratio: float | None


@dataclass(frozen=True)
class HopSnapshot:
    """Every plane's hop histograms at one moment (or the difference of two), by (plane, hop)."""

    hops: Mapping[HopKey, HopHistogram] = field(default_factory=dict)
    steps: Mapping[str, float] = field(default_factory=dict)
    """The simulator pod's step counters (:data:`STEP_FAMILIES`' keys), where the pod has them."""
    cpu_s: Mapping[str, float] = field(default_factory=dict)
    """CPU seconds by process (:func:`cpu_seconds`); in a round's difference, what the round used."""
    output_tokens: int = 0
    """The output tokens the round delivered (a difference of two scrapes has none of its own)."""

    def __sub__(self, earlier: HopSnapshot) -> HopSnapshot:
        return HopSnapshot(
            {key: now - earlier.hops[key] if key in earlier.hops else now for key, now in self.hops.items()},
            {name: now - earlier.steps.get(name, 0.0) for name, now in self.steps.items()},
            {name: now - earlier.cpu_s[name] for name, now in self.cpu_s.items() if name in earlier.cpu_s},
            self.output_tokens - earlier.output_tokens,
        )

    def __add__(self, other: HopSnapshot) -> HopSnapshot:
        merged = dict(self.hops)
        for key, histogram in other.hops.items():
            merged[key] = merged[key] + histogram if key in merged else histogram
        steps = dict(self.steps)
        for name, count in other.steps.items():
            steps[name] = steps.get(name, 0.0) + count
        cpu = dict(self.cpu_s)
        for name, seconds in other.cpu_s.items():
            cpu[name] = cpu.get(name, 0.0) + seconds
        return HopSnapshot(merged, steps, cpu, self.output_tokens + other.output_tokens)

    def cpu_us_per_token(self) -> dict[str, float] | None:
        """Each process's CPU time per output token in microseconds, and the
        ``total`` of those that serve (all but the :data:`CLIENT`); None
        when the round counted no serving process or no token."""
        serving = {name: seconds for name, seconds in self.cpu_s.items() if name != CLIENT}
        if not serving or self.output_tokens <= 0:
            return None
        per = {name: round(seconds * 1e6 / self.output_tokens, 2) for name, seconds in self.cpu_s.items()}
        per["total"] = round(sum(serving.values()) * 1e6 / self.output_tokens, 2)
        return per

    def pod_steps(self) -> PodSteps | None:
        """The pod's steps and those that prefilled; None where it counts none."""
        if "steps" not in self.steps:
            return None
        steps, prefill = int(self.steps["steps"]), int(self.steps.get("prefill_steps", 0.0))
        per_100 = round(100.0 * prefill / steps, 2) if steps else None
        return {"steps": steps, "prefill_steps": prefill, "prefill_steps_per_100": per_100}

    def mean_s(self, plane: str, hop: str) -> float:
        histogram = self.hops.get((plane, hop))
        mean = histogram.mean_s if histogram is not None else None
        return mean or 0.0

    def pod_mean_s(self) -> float:
        """The pod's whole time to a first token, in means."""
        return sum(self.mean_s("engine", hop) for plane, hop in self.hops if plane == "engine")

    def table(self, client_added_mean_ms: float | None, direct: HopSnapshot | None = None) -> HopTable:
        """The report's figures: each hop's count, mean, p50 and p99 in ms and
        its group; each group's mean (``pod_vs_direct`` from ``direct``, the
        pod's hops of direct's calls); their sum beside ``client_added_mean_ms``."""
        rows: list[dict[str, object]] = []
        groups: dict[str, float] = dict.fromkeys(MESH_GROUPS, 0.0)
        groups["pod"] = 0.0
        for (plane, hop), histogram in sorted(self.hops.items(), key=_hop_order):
            group = GROUPS.get((plane, hop), "other")
            mean = histogram.mean_s
            rows.append(
                {
                    "plane": plane,
                    "hop": hop,
                    "group": group,
                    "turns": int(histogram.count),
                    "mean_ms": _ms(mean),
                    "p50_ms": _ms(histogram.quantile_s(0.5)),
                    "p99_ms": _ms(histogram.quantile_s(0.99)),
                }
            )
            if mean is not None and group in groups:
                groups[group] += mean * 1000.0
        region_total = sum(self.mean_s("region", hop) for plane, hop in self.hops if plane == "region")
        pod_total = self.pod_mean_s()
        direct_pod = direct.pod_mean_s() if direct is not None else 0.0
        if pod_total and direct_pod:
            groups["pod_vs_direct"] = (pod_total - direct_pod) * 1000.0
        edge_wait = self.mean_s(*_EDGE_WAIT)
        if edge_wait and region_total:
            groups["edge_region_transport"] = (edge_wait - region_total) * 1000.0
        pod_wait = sum(self.mean_s("region", hop) for hop in _POD_WAIT if hop != "request_id_hold")
        if pod_wait and pod_total:
            groups["region_pod_transport"] = (pod_wait - pod_total) * 1000.0
        mesh_sum = sum(groups[group] for group in MESH_GROUPS)
        cpu = self.cpu_us_per_token()
        direct_cpu = direct.cpu_us_per_token() if direct is not None else None
        return {
            "hops": rows,
            "groups_mean_ms": {name: round(value, 4) for name, value in groups.items()},
            "mesh_hops_sum_mean_ms": round(mesh_sum, 4),
            "client_added_ttft_mean_ms": _round(client_added_mean_ms),
            "unaccounted_mean_ms": _round(
                None if client_added_mean_ms is None else client_added_mean_ms - mesh_sum
            ),
            "pod_steps": self.pod_steps(),
            "direct_pod_steps": direct.pod_steps() if direct is not None else None,
            "cpu_us_per_token": cpu,
            "direct_cpu_us_per_token": direct_cpu,
            "cpu_ratio": (
                round(cpu["total"] / direct_cpu["total"], 3)
                if cpu is not None and direct_cpu is not None and direct_cpu["total"] > 0
                else None
            ),
        }


_PLANE_ORDER = {"edge": 0, "region": 1, "engine": 2}
_HOP_ORDER = {"edge": EDGE_HOPS, "region": REGION_HOPS, "engine": ENGINE_HOPS}


def _hop_order(item: tuple[HopKey, HopHistogram]) -> tuple[int, float]:
    """Planes edge, region, engine; within a plane, hops in the order a turn passes them."""
    (plane, hop), _ = item
    order = _HOP_ORDER[plane]
    return _PLANE_ORDER[plane], order.index(hop) if hop in order else len(order)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 4)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def parse_hops(plane: str, text: str) -> dict[HopKey, HopHistogram]:
    """The hop histograms of ``plane`` in a ``/metrics`` text."""
    wanted = PLANE_FAMILIES[plane]
    buckets: dict[str, list[tuple[float, float]]] = {}
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != wanted:
            continue
        for sample in family.samples:
            hop = sample.labels.get("hop", "")
            if sample.name.endswith("_bucket"):
                buckets.setdefault(hop, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                counts[hop] = sample.value
            elif sample.name.endswith("_sum"):
                sums[hop] = sample.value
    found: dict[HopKey, HopHistogram] = {}
    for hop, pairs in buckets.items():
        pairs.sort()
        found[(plane, hop)] = HopHistogram(
            tuple(bound for bound, _ in pairs),
            tuple(count for _, count in pairs),
            counts.get(hop, 0.0),
            sums.get(hop, 0.0),
        )
    return found


async def scrape_hops(client: httpx.AsyncClient, metrics_urls: Mapping[str, str]) -> HopSnapshot:
    """Every plane's hop histograms now, from its ``/metrics`` URL by plane
    name. A kept-alive connection the server closed meanwhile (a metrics
    server idle between rounds) is asked again once, on a new connection."""
    hops: dict[HopKey, HopHistogram] = {}
    steps: dict[str, float] = {}
    for plane, url in metrics_urls.items():
        try:
            response = await client.get(url)
        except httpx.TransportError:
            response = await client.get(url, headers={"connection": "close"})
        response.raise_for_status()
        hops.update(parse_hops(plane, response.text))
        if plane == "engine":
            steps.update(parse_steps(response.text))
    return HopSnapshot(hops, steps)


def parse_steps(text: str) -> dict[str, float]:
    """The simulator pod's step counters in a ``/metrics`` text (none for another engine)."""
    names = {family: name for name, family in STEP_FAMILIES.items()}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            found[names[family.name]] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return found


CLIENT = "client"
"""The benchmark's own process, in :func:`cpu_seconds`: the client of every system."""


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """The CPU time, user and system, each process of ``pids`` (by name)
    has used, from ``/proc``, and this process's own as :data:`CLIENT`; a
    process that cannot be read (gone, or no ``/proc``) is left out."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {CLIENT: time.process_time()}
    for name, pid in pids.items():
        try:
            # The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            found[name] = (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue
    return found


def total(snapshots: Iterable[HopSnapshot]) -> HopSnapshot:
    """The rounds' differences added up."""
    out = HopSnapshot()
    for snapshot in snapshots:
        out = out + snapshot
    return out
