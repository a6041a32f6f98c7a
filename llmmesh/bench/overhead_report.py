"""The report of ``llmmesh bench overhead``: both paths' figures at every
level, what the mesh adds (time to first token in milliseconds, throughput
as a share of direct's), and whether the targets hold at their level; for
each run made, the region's safety filters off (the transport) or on (the
product path), and with both, what the output filter adds on its own.
Where a run measured the mesh on mutual TLS beside the plaintext one
(``mesh_mtls``), what mTLS adds to time to first token over its plaintext
twin (``mesh_twin``), and how far the twin is from the plaintext mesh;
where it measured the mesh with tracing on, what tracing a turn adds: its
sampled turns (``mesh_traced``) against its unsampled ones
(``mesh_unsampled``), and against the twin.
Rendered as MISSION's one JSON line, or as a table by :mod:`llmmesh.bench.overhead_table`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmmesh.bench.overhead_hops import HopSnapshot, HopTable
from llmmesh.bench.report import ratio
from llmmesh.bench.stats import LevelMetrics, RequestRecord, percentile, summarize

MESH = "mesh"
DIRECT = "direct"
MESH_MTLS = "mesh_mtls"
# The plaintext mesh again, on a pod of its own as mesh_mtls has: what mTLS
# adds is measured against it, and against ``mesh`` it shows how far two
# identical meshes differ (the resolution of the comparison).
MESH_TWIN = "mesh_twin"
# The plaintext mesh with every plane tracing (OpenTelemetry, exported over
# OTLP to a collector that takes and drops the spans), on a pod of its own:
# the turns of its rounds that were sampled (every plane records and exports
# their spans) ...
MESH_TRACED = "mesh_traced"
# ... and those that were not, interleaved with them in the same rounds.
MESH_UNSAMPLED = "mesh_unsampled"
SYSTEMS = (DIRECT, MESH)
# What mTLS adds to the mesh's median time to first token, the figure its target judges.
MTLS_ADDED_P50 = "mtls_added_ttft_p50_ms"
# What tracing adds to it, likewise.
TRACED_ADDED_P50 = "traced_added_ttft_p50_ms"


def systems_of(tls: str, traced: bool = False) -> tuple[str, ...]:
    """The systems a run measures: direct and the mesh; with ``tls``
    ``both`` a twin of the mesh and the same mesh on mutual TLS; with
    ``traced`` the twin and the same mesh with tracing on, its sampled and
    its unsampled turns; each mesh but the first on a pod of its own."""
    systems: tuple[str, ...] = SYSTEMS
    if tls == "both" or traced:
        systems = (*systems, MESH_TWIN)
    if tls == "both":
        systems = (*systems, MESH_MTLS)
    if traced:
        systems = (*systems, MESH_TRACED, MESH_UNSAMPLED)
    return systems


@dataclass(frozen=True)
class PathMetrics:
    """One system at one level: MISSION's metrics plus the inter-token
    latency's tail."""

    metrics: LevelMetrics
    itl_p90_s: float | None
    itl_p99_s: float | None
    # Every request's time to first token, for the confidence intervals.
    ttfts_s: tuple[float, ...] = ()

    @classmethod
    def of(cls, records: Sequence[RequestRecord], wall_s: float) -> PathMetrics:
        """Figures of ``records`` (failed ones give no latency samples)."""
        itls = [sample for record in records if record.ok for sample in record.itl_samples()]
        return cls(
            summarize(records, wall_s),
            percentile(itls, 90) if itls else None,
            percentile(itls, 99) if itls else None,
            tuple(ttft for record in records if record.ok and (ttft := record.ttft_s) is not None),
        )

    def as_dict(self) -> dict[str, float | int | None]:
        return self.metrics.as_dict() | {
            "itl_p90_s": _round(self.itl_p90_s, 6),
            "itl_p99_s": _round(self.itl_p99_s, 6),
        }


@dataclass(frozen=True)
class Targets:
    """What the mesh may add at ``concurrency``: time to first token at the
    median and the 99th percentile, and the share of direct's throughput
    it must keep; and what mutual TLS, and tracing, may each add to the
    mesh's median time to first token."""

    concurrency: int = 16
    added_ttft_p50_ms_max: float = 3.0
    added_ttft_p99_ms_max: float = 10.0
    output_tok_s_ratio_min: float = 0.5
    mtls_added_ttft_p50_ms_max: float = 1.0
    traced_added_ttft_p50_ms_max: float = 1.0

    def met(self, deltas: Mapping[str, float | None]) -> dict[str, bool | None]:
        """Each target's verdict on one level's deltas, and ``all`` (a
        missing figure meets nothing). The mTLS verdict is None when the
        level's deltas have no mTLS figure at all (not measured), and
        ``all`` then leaves it out."""
        checks: dict[str, bool | None] = {
            "added_ttft_p50": _at_most(deltas.get("added_ttft_p50_ms"), self.added_ttft_p50_ms_max),
            "added_ttft_p99": _at_most(deltas.get("added_ttft_p99_ms"), self.added_ttft_p99_ms_max),
            "output_tok_s": _at_least(deltas.get("output_tok_s_ratio"), self.output_tok_s_ratio_min),
            "mtls_ttft_p50": (
                _at_most(deltas[MTLS_ADDED_P50], self.mtls_added_ttft_p50_ms_max)
                if MTLS_ADDED_P50 in deltas
                else None
            ),
            "traced_ttft_p50": (
                _at_most(deltas[TRACED_ADDED_P50], self.traced_added_ttft_p50_ms_max)
                if TRACED_ADDED_P50 in deltas
                else None
            ),
        }
        return {**checks, "all": all(verdict is not False for verdict in checks.values())}

    def as_dict(self) -> dict[str, float | int]:
        return {
            "concurrency": self.concurrency,
            "added_ttft_p50_ms_max": self.added_ttft_p50_ms_max,
            "added_ttft_p99_ms_max": self.added_ttft_p99_ms_max,
            "output_tok_s_ratio_min": self.output_tok_s_ratio_min,
            "mtls_added_ttft_p50_ms_max": self.mtls_added_ttft_p50_ms_max,
            "traced_added_ttft_p50_ms_max": self.traced_added_ttft_p50_ms_max,
        }


TARGET_NAMES = ("added_ttft_p50", "added_ttft_p99", "output_tok_s", "mtls_ttft_p50", "traced_ttft_p50", "all")


@dataclass(frozen=True)
class DefaultPathTargets:
    """What the default path (the output filter on, judged on the run with
    the filters on; mutual TLS by its own comparison, ``targets_met``'s
    ``mtls_ttft_p50``) may add: time to first token at the median and the
    99th percentile at concurrency 16 and at the median at 64, the share of
    direct's throughput at 64, and how far the per-hop table's sum may be
    from the client-side mean at 16."""

    c16_added_ttft_p50_ms_max: float = 2.0
    c16_added_ttft_p99_ms_max: float = 10.0
    c64_added_ttft_p50_ms_max: float = 5.0
    c64_output_tok_s_ratio_min: float = 0.97
    c16_hops_unaccounted_ms_max: float = 1.0

    def met(
        self, deltas: Mapping[str, Mapping[str, float | None]], hops: Mapping[str, HopTable]
    ) -> dict[str, bool | None]:
        """Each target's verdict (None where its level was not run), and
        ``all`` (False while any verdict is False or missing)."""
        c16, c64 = deltas.get("c16"), deltas.get("c64")
        table = hops.get(key(MESH, 16))
        unaccounted = None if table is None else table["unaccounted_mean_ms"]
        limits = (
            ("c16_added_ttft_p50", c16, "added_ttft_p50_ms", self.c16_added_ttft_p50_ms_max),
            ("c16_added_ttft_p99", c16, "added_ttft_p99_ms", self.c16_added_ttft_p99_ms_max),
            ("c64_added_ttft_p50", c64, "added_ttft_p50_ms", self.c64_added_ttft_p50_ms_max),
        )
        checks: dict[str, bool | None] = {
            name: None if level is None else _at_most(level.get(figure), limit)
            for name, level, figure, limit in limits
        }
        checks["c64_output_tok_s"] = (
            None if c64 is None else _at_least(c64.get("output_tok_s_ratio"), self.c64_output_tok_s_ratio_min)
        )
        checks["c16_hops_sum"] = (
            None
            if table is None
            else _at_most(None if unaccounted is None else abs(unaccounted), self.c16_hops_unaccounted_ms_max)
        )
        return {**checks, "all": all(verdict is True for verdict in checks.values())}

    def as_dict(self) -> dict[str, float]:
        return {
            "c16_added_ttft_p50_ms_max": self.c16_added_ttft_p50_ms_max,
            "c16_added_ttft_p99_ms_max": self.c16_added_ttft_p99_ms_max,
            "c64_added_ttft_p50_ms_max": self.c64_added_ttft_p50_ms_max,
            "c64_output_tok_s_ratio_min": self.c64_output_tok_s_ratio_min,
            "c16_hops_unaccounted_ms_max": self.c16_hops_unaccounted_ms_max,
        }


def _at_most(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def _at_least(value: float | None, limit: float) -> bool:
    return value is not None and value >= limit


def _added_ms(mesh: float | None, direct: float | None) -> float | None:
    return None if mesh is None or direct is None else (mesh - direct) * 1000.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = "overhead-bootstrap"


def median_difference_ci_ms(
    a: Sequence[float], b: Sequence[float], level: float = 0.95
) -> tuple[float, float] | None:
    """A percentile-bootstrap confidence interval, in ms, of the median of
    ``a`` minus the median of ``b`` (seconds each): both resampled with
    replacement, :data:`BOOTSTRAP_RESAMPLES` times from a fixed seed. None
    without samples on both sides.

    A median of times to first token at a busy pod moves in steps: a
    request's wait for the next decode step spreads the samples over a
    whole step, and a millisecond more on the path moves some of them past
    a step boundary. The interval says how far the measured difference
    could be from the one more requests would show."""
    if not a or not b:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    diffs = sorted(
        percentile(rng.choices(a, k=len(a)), 50) - percentile(rng.choices(b, k=len(b)), 50)
        for _ in range(BOOTSTRAP_RESAMPLES)
    )
    tail = (1.0 - level) / 2
    low = diffs[int(tail * (len(diffs) - 1))]
    high = diffs[int((1.0 - tail) * (len(diffs) - 1))]
    return low * 1000.0, high * 1000.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ttft_difference(prefix: str, a: PathMetrics, b: PathMetrics) -> dict[str, float | None]:
    """``a``'s time to first token minus ``b``'s at one level, in ms,
    percentile by percentile and on average, with a 95% confidence
    interval of the median's (:func:`median_difference_ci_ms`); keys start
    with ``prefix``."""
    m, p = a.metrics, b.metrics
    ci = median_difference_ci_ms(a.ttfts_s, b.ttfts_s)
    return {
        f"{prefix}_ttft_p50_ms": _added_ms(m.ttft_p50_s, p.ttft_p50_s),
        f"{prefix}_ttft_p50_ci95_low_ms": None if ci is None else ci[0],
        f"{prefix}_ttft_p50_ci95_high_ms": None if ci is None else ci[1],
        f"{prefix}_ttft_mean_ms": _added_ms(_mean(a.ttfts_s), _mean(b.ttfts_s)),
        f"{prefix}_ttft_p90_ms": _added_ms(m.ttft_p90_s, p.ttft_p90_s),
        f"{prefix}_ttft_p99_ms": _added_ms(m.ttft_p99_s, p.ttft_p99_s),
    }


def mtls_added(mtls: PathMetrics, twin: PathMetrics, plaintext: PathMetrics) -> dict[str, float | None]:
    """What mutual TLS between the planes adds to the mesh's time to first
    token at one level (``mtls_added_*``): the mTLS mesh minus its plaintext
    twin, both on pods of their own; and how far the twin is from the
    plaintext mesh (``twin_added_*``), two identical meshes, the figure
    that says what difference the comparison can resolve."""
    return ttft_difference("mtls_added", mtls, twin) | ttft_difference("twin_added", twin, plaintext)


def traced_added(
    traced: PathMetrics, unsampled: PathMetrics, twin: PathMetrics, plaintext: PathMetrics
) -> dict[str, float | None]:
    """What tracing adds to the mesh's time to first token at one level:
    ``traced_added_*``, the traced mesh's sampled turns minus its unsampled
    ones, interleaved in the same rounds (the figure its target judges);
    ``traced_vs_twin_added_*``, the sampled turns minus the untraced twin's,
    a mesh on a pod of its own; and the twin against the mesh
    (``twin_added_*``), the resolution of a comparison between two meshes,
    as for :func:`mtls_added`."""
    return (
        ttft_difference("traced_added", traced, unsampled)
        | ttft_difference("traced_vs_twin_added", traced, twin)
        | ttft_difference("twin_added", twin, plaintext)
    )


def deltas(mesh: PathMetrics, direct: PathMetrics) -> dict[str, float | None]:
    """What the mesh adds over direct at one level: latencies in ms (mesh
    minus direct, percentile by percentile), throughput as mesh / direct."""
    m, d = mesh.metrics, direct.metrics
    return {
        "added_ttft_p50_ms": _added_ms(m.ttft_p50_s, d.ttft_p50_s),
        "added_ttft_p90_ms": _added_ms(m.ttft_p90_s, d.ttft_p90_s),
        "added_ttft_p99_ms": _added_ms(m.ttft_p99_s, d.ttft_p99_s),
        "added_itl_p50_ms": _added_ms(m.itl_p50_s, d.itl_p50_s),
        "added_itl_p99_ms": _added_ms(mesh.itl_p99_s, direct.itl_p99_s),
        "output_tok_s_ratio": ratio(m.output_tok_s, d.output_tok_s),
        "ttft_p50_ratio": ratio(m.ttft_p50_s, d.ttft_p50_s),
    }


TRANSPORT = "transport"
WITH_OUTPUT_FILTER = "with_output_filter"
# What the top-level figures and the targets' verdicts were measured on.
TARGETS_MEASURED_ON = {
    False: "mesh path with the region's safety filters off (transport)",
    True: "mesh path with the region's safety filters on",
}
PLANES = {
    "off": "planes on plaintext gRPC",
    "both": "planes on plaintext gRPC, and mesh_twin and mesh_mtls: the same mesh twice more, on plaintext "
    "and on mutual TLS",
    "on": "planes on mutual TLS",
}


def targets_measured_on(safety: bool, tls: str, traced: bool = False) -> str:
    """What a run's figures describe: its safety setting, how its planes
    talk, and whether a traced mesh ran beside."""
    traced_too = (
        f", and {MESH_TRACED} and {MESH_UNSAMPLED}: the sampled and the unsampled turns of the same mesh "
        "with tracing on"
        if traced
        else ""
    )
    return f"{TARGETS_MEASURED_ON[safety]}, {PLANES[tls]}{traced_too}"


_FILTER_ADDED = {
    "filter_added_ttft_p50_ms": "added_ttft_p50_ms",
    "filter_added_ttft_p99_ms": "added_ttft_p99_ms",
}


@dataclass(frozen=True)
class OverheadRun:
    """One whole measurement in its own mesh, the region's safety filters
    on or off, its planes on plaintext or mTLS or both side by side
    (``tls``, as :class:`~llmmesh.bench.overhead_plan.OverheadBenchPlan`
    says): results keyed ``{system}/c{level}`` (``direct/c16``,
    ``mesh/c16``, ``mesh_twin/c16``, ``mesh_mtls/c16``), replies whose lengths differed from
    direct's by level, what the run's setup adds to the report's
    (``setup``), and under the same keys the request that began each round
    after its system idled (``after_idle``, kept out of ``results``)."""

    safety: bool
    results: Mapping[str, PathMetrics]
    length_mismatches: Mapping[str, int] = field(default_factory=dict)
    setup: Mapping[str, object] = field(default_factory=dict)
    after_idle: Mapping[str, Sequence[RequestRecord]] = field(default_factory=dict)
    tls: str = "off"
    # Whether the run measured a mesh with tracing on beside the others.
    traced: bool = False
    # Each mesh's hop histograms of its measured rounds, by ``{system}/c{level}``.
    hops: Mapping[str, HopSnapshot] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return run_name(self.safety)

    @property
    def systems(self) -> tuple[str, ...]:
        return systems_of(self.tls, self.traced)

    @property
    def measures_mtls(self) -> bool:
        """Whether the run has an mTLS mesh beside a plaintext one."""
        return MESH_MTLS in self.systems

    def deltas(self, levels: Sequence[int]) -> dict[str, dict[str, float | None]]:
        """:func:`deltas` by level (``c16``), and :func:`mtls_added` where
        the run measured the mesh on mTLS beside it."""
        by_level = {}
        for level in levels:
            values = deltas(self.results[key(MESH, level)], self.results[key(DIRECT, level)])
            if self.measures_mtls:
                values |= mtls_added(
                    self.results[key(MESH_MTLS, level)],
                    self.results[key(MESH_TWIN, level)],
                    self.results[key(MESH, level)],
                )
            if self.traced:
                values |= traced_added(
                    self.results[key(MESH_TRACED, level)],
                    self.results[key(MESH_UNSAMPLED, level)],
                    self.results[key(MESH_TWIN, level)],
                    self.results[key(MESH, level)],
                )
            by_level[f"c{level}"] = values
        return by_level

    def errors(self) -> int:
        idle_failures = sum(not record.ok for records in self.after_idle.values() for record in records)
        return sum(path.metrics.errors for path in self.results.values()) + idle_failures

    def _after_idle_median(self, system: str, level: int) -> float | None:
        records = self.after_idle.get(key(system, level), ())
        ttfts = [ttft for record in records if (ttft := record.ttft_s) is not None]
        return percentile(ttfts, 50) if ttfts else None

    def added_after_idle_ms(self, level: int, system: str = MESH, over: str = DIRECT) -> float | None:
        """What ``system`` adds over ``over`` to the time to first token of a
        round's first request, sent after the system idled: the medians
        over rounds, one minus the other; None when not measured or every
        such request failed."""
        return _added_ms(self._after_idle_median(system, level), self._after_idle_median(over, level))

    def hops_dict(self, levels: Sequence[int]) -> dict[str, HopTable]:
        """Where each mesh's added time to first token goes, by
        ``{system}/c{level}``: :meth:`HopSnapshot.table` beside the
        client-side figure, the mesh's mean time to first token less direct's."""
        tables: dict[str, HopTable] = {}
        for level in levels:
            direct = _mean(self.results[key(DIRECT, level)].ttfts_s)
            for system in self.systems:
                snapshot = self.hops.get(key(system, level))
                if snapshot is None or system == DIRECT:
                    continue
                mesh = _mean(self.results[key(system, level)].ttfts_s)
                tables[key(system, level)] = snapshot.table(
                    _added_ms(mesh, direct), self.hops.get(key(DIRECT, level))
                )
        return tables

    def results_dict(self, levels: Sequence[int]) -> dict[str, dict[str, float | int | None]]:
        return {
            key(system, level): self.results[key(system, level)].as_dict()
            for level in levels
            for system in self.systems
        }

    def ratios_dict(self, levels: Sequence[int]) -> dict[str, dict[str, float | int | None]]:
        ratios: dict[str, dict[str, float | int | None]] = {}
        for level, values in zip(levels, self.deltas(levels).values(), strict=True):
            row: dict[str, float | int | None] = {name: _round(value, 4) for name, value in values.items()}
            row["added_ttft_after_idle_ms"] = _round(self.added_after_idle_ms(level), 4)
            if self.measures_mtls:
                after_idle = self.added_after_idle_ms(level, MESH_MTLS, MESH_TWIN)
                row["mtls_added_ttft_after_idle_ms"] = _round(after_idle, 4)
            if self.traced:
                after_idle = self.added_after_idle_ms(level, MESH_TRACED, MESH_TWIN)
                row["traced_added_ttft_after_idle_ms"] = _round(after_idle, 4)
            row["length_mismatches"] = self.length_mismatches.get(f"c{level}", 0)
            ratios[f"c{level}"] = row
        return ratios


def run_name(safety: bool) -> str:
    """A run's name in the report: ``transport`` with the region's safety
    filters off, ``with_output_filter`` with them on."""
    return WITH_OUTPUT_FILTER if safety else TRANSPORT


def filter_added(
    on: Mapping[str, Mapping[str, float | None]], off: Mapping[str, Mapping[str, float | None]]
) -> dict[str, dict[str, float | None]]:
    """What the output filter adds to time to first token at each level, in
    ms: what the mesh adds with the filter on (``on``, :func:`deltas` by
    level) minus what it adds with it off (``off``), at p50 and p99. Each
    run is measured against its own direct reference, so the pod's share
    cancels out."""
    return {
        name: {level: _difference(on[level].get(delta), off[level].get(delta)) for level in on}
        for name, delta in _FILTER_ADDED.items()
    }


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


@dataclass(frozen=True)
class OverheadReport:
    """The runs made (one, or the transport run then the one with the
    output filter) and the setup they share (engine timing, workload).
    The targets are judged on :attr:`targets_run`."""

    model: str
    levels: Sequence[int]
    runs: Sequence[OverheadRun]
    setup: Mapping[str, object]
    measured: str
    targets: Targets = field(default_factory=Targets)
    default_path_targets: DefaultPathTargets = field(default_factory=DefaultPathTargets)

    def __post_init__(self) -> None:
        if len(self.runs) not in (1, 2) or len({run.safety for run in self.runs}) != len(self.runs):
            raise ValueError(
                "a report holds one run, or one with the safety filters off and one with them on"
            )
        for run in self.runs:
            for level in self.levels:
                for system in run.systems:
                    if key(system, level) not in run.results:
                        raise ValueError(f"no result for {key(system, level)} in the {run.name} run")

    @property
    def targets_run(self) -> OverheadRun:
        """The run the top-level figures and the targets describe: the
        transport run when it was made (the filter's hold is one decode
        step by design, not transport), else the only run."""
        return next((run for run in self.runs if not run.safety), self.runs[0])

    @property
    def filter_run(self) -> OverheadRun | None:
        """The run with the output filter on, when both were made."""
        return next((run for run in self.runs if run.safety), None) if len(self.runs) == 2 else None

    def deltas(self) -> dict[str, dict[str, float | None]]:
        """:func:`deltas` of :attr:`targets_run` by level (``c16``)."""
        return self.targets_run.deltas(self.levels)

    def filter_added(self) -> dict[str, dict[str, float | None]]:
        """:func:`filter_added` when both runs were made, else empty."""
        filtered = self.filter_run
        if filtered is None:
            return {}
        return filter_added(filtered.deltas(self.levels), self.deltas())

    def targets_met(self) -> dict[str, bool | None]:
        """The verdicts at the targets' level; None each when it was not run."""
        at = self.deltas().get(f"c{self.targets.concurrency}")
        if at is None:
            return dict.fromkeys(TARGET_NAMES)
        return dict(self.targets.met(at))

    def default_path_met(self) -> dict[str, bool | None] | None:
        """:class:`DefaultPathTargets`' verdicts on the run with the output
        filter on; None when no such run was made."""
        run = next((run for run in self.runs if run.safety), None)
        if run is None:
            return None
        return self.default_path_targets.met(run.deltas(self.levels), run.hops_dict(self.levels))

    def errors(self) -> int:
        """Failed requests over every run."""
        return sum(run.errors() for run in self.runs)

    def as_dict(self) -> dict[str, object]:
        """MISSION's report object: scenario, results, ratios, the targets
        with their verdicts and where the added time goes hop by hop
        (``hops``), all of :attr:`targets_run`; with both runs, the other
        one under ``with_output_filter``."""
        target = self.targets_run
        runs = {
            run.name: {
                "safety": "on" if run.safety else "off",
                "tls": run.tls,
                "tracing": "both" if run.traced else "off",
                **run.setup,
            }
            for run in self.runs
        }
        body: dict[str, object] = {
            "scenario": "overhead",
            "model": self.model,
            "measured": self.measured,
            "setup": {**self.setup, "runs": runs},
            "results": target.results_dict(self.levels),
            "ratios": target.ratios_dict(self.levels),
            "targets": self.targets.as_dict(),
            "targets_met": self.targets_met(),
            "targets_measured_on": targets_measured_on(target.safety, target.tls, target.traced),
            "hops": target.hops_dict(self.levels),
        }
        default_path = self.default_path_met()
        if default_path is not None:
            body["default_path_targets"] = self.default_path_targets.as_dict()
            body["default_path_targets_met"] = default_path
        filtered = self.filter_run
        if filtered is not None:
            body[WITH_OUTPUT_FILTER] = {
                "results": filtered.results_dict(self.levels),
                "ratios": filtered.ratios_dict(self.levels),
                "hops": filtered.hops_dict(self.levels),
            } | {
                name: {level: _round(value, 4) for level, value in by_level.items()}
                for name, by_level in self.filter_added().items()
            }
        return body

    def to_json(self) -> str:
        """One line of strict JSON (no NaN)."""
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        """The same figures as a plain-text table for people."""
        from llmmesh.bench.overhead_table import render_table

        return render_table(self)


def key(system: str, level: int) -> str:
    """A result's key: ``mesh/c16``."""
    return f"{system}/c{level}"
