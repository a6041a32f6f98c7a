"""The report of ``llmmesh bench overhead``: both paths' figures at every
level, what the mesh adds (time to first token in milliseconds, throughput
as a share of direct's), and whether the targets hold at their level.
Rendered as MISSION's one JSON line or a table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmmesh.bench.report import ratio
from llmmesh.bench.stats import LevelMetrics, RequestRecord, percentile, summarize

MESH = "mesh"
DIRECT = "direct"
SYSTEMS = (DIRECT, MESH)


@dataclass(frozen=True)
class PathMetrics:
    """One system at one level: MISSION's metrics plus the inter-token
    latency's tail."""

    metrics: LevelMetrics
    itl_p90_s: float | None
    itl_p99_s: float | None

    @classmethod
    def of(cls, records: Sequence[RequestRecord], wall_s: float) -> PathMetrics:
        """Figures of ``records`` (failed ones give no latency samples)."""
        itls = [sample for record in records if record.ok for sample in record.itl_samples()]
        return cls(
            summarize(records, wall_s),
            percentile(itls, 90) if itls else None,
            percentile(itls, 99) if itls else None,
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
    it must keep."""

    concurrency: int = 16
    added_ttft_p50_ms_max: float = 3.0
    added_ttft_p99_ms_max: float = 10.0
    output_tok_s_ratio_min: float = 0.5

    def met(self, deltas: Mapping[str, float | None]) -> dict[str, bool | None]:
        """Each target's verdict on one level's deltas, and ``all`` (a
        missing figure meets nothing)."""
        checks = {
            "added_ttft_p50": _at_most(deltas.get("added_ttft_p50_ms"), self.added_ttft_p50_ms_max),
            "added_ttft_p99": _at_most(deltas.get("added_ttft_p99_ms"), self.added_ttft_p99_ms_max),
            "output_tok_s": _at_least(deltas.get("output_tok_s_ratio"), self.output_tok_s_ratio_min),
        }
        return {**checks, "all": all(checks.values())}

    def as_dict(self) -> dict[str, float | int]:
        return {
            "concurrency": self.concurrency,
            "added_ttft_p50_ms_max": self.added_ttft_p50_ms_max,
            "added_ttft_p99_ms_max": self.added_ttft_p99_ms_max,
            "output_tok_s_ratio_min": self.output_tok_s_ratio_min,
        }


def _at_most(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def _at_least(value: float | None, limit: float) -> bool:
    return value is not None and value >= limit


def _added_ms(mesh: float | None, direct: float | None) -> float | None:
    return None if mesh is None or direct is None else (mesh - direct) * 1000.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


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


@dataclass(frozen=True)
class OverheadReport:
    """Results keyed ``{system}/c{level}`` (``direct/c16``, ``mesh/c16``);
    ``setup`` describes the run (engine timing, safety, workload)."""

    model: str
    levels: Sequence[int]
    results: Mapping[str, PathMetrics]
    setup: Mapping[str, object]
    measured: str
    length_mismatches: Mapping[str, int] = field(default_factory=dict)
    targets: Targets = field(default_factory=Targets)

    def __post_init__(self) -> None:
        for level in self.levels:
            for system in SYSTEMS:
                if key(system, level) not in self.results:
                    raise ValueError(f"no result for {key(system, level)}")

    def deltas(self) -> dict[str, dict[str, float | None]]:
        """:func:`deltas` by level (``c16``)."""
        return {
            f"c{level}": deltas(self.results[key(MESH, level)], self.results[key(DIRECT, level)])
            for level in self.levels
        }

    def targets_met(self) -> dict[str, bool | None]:
        """The verdicts at the targets' level; None each when it was not run."""
        at = self.deltas().get(f"c{self.targets.concurrency}")
        if at is None:
            return dict.fromkeys(("added_ttft_p50", "added_ttft_p99", "output_tok_s", "all"))
        return dict(self.targets.met(at))

    def errors(self) -> int:
        return sum(path.metrics.errors for path in self.results.values())

    def as_dict(self) -> dict[str, object]:
        """MISSION's report object: scenario, results, ratios, and the
        targets with their verdicts."""
        return {
            "scenario": "overhead",
            "model": self.model,
            "measured": self.measured,
            "setup": dict(self.setup),
            "results": {
                key(system, level): self.results[key(system, level)].as_dict()
                for level in self.levels
                for system in SYSTEMS
            },
            "ratios": {
                level: {name: _round(value, 4) for name, value in values.items()}
                | {"length_mismatches": self.length_mismatches.get(level, 0)}
                for level, values in self.deltas().items()
            },
            "targets": self.targets.as_dict(),
            "targets_met": self.targets_met(),
        }

    def to_json(self) -> str:
        """One line of strict JSON (no NaN)."""
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        """The same figures as a plain-text table for people."""
        lines = [
            f"overhead benchmark, model {self.model}: {self.measured}",
            "",
            f"{'system/level':<14} {'reqs':>5} {'errs':>5} {'out tok/s':>10} {'ttft p50':>9} "
            f"{'ttft p90':>9} {'ttft p99':>9} {'itl p50':>9} {'itl p99':>9}",
        ]
        for level in self.levels:
            for system in SYSTEMS:
                path = self.results[key(system, level)]
                m = path.metrics
                lines.append(
                    f"{key(system, level):<14} {m.requests:>5} {m.errors:>5} {m.output_tok_s:>10.1f} "
                    f"{_ms(m.ttft_p50_s)} {_ms(m.ttft_p90_s)} {_ms(m.ttft_p99_s)} "
                    f"{_ms(m.itl_p50_s)} {_ms(path.itl_p99_s)}"
                )
        lines += [
            "",
            "what the mesh adds",
            f"{'level':<8} {'ttft p50':>10} {'ttft p90':>10} {'ttft p99':>10} {'itl p50':>10} {'tok/s':>7}",
        ]
        for name, values in self.deltas().items():
            lines.append(
                f"{name:<8} {_added(values['added_ttft_p50_ms'])} {_added(values['added_ttft_p90_ms'])} "
                f"{_added(values['added_ttft_p99_ms'])} {_added(values['added_itl_p50_ms'])} "
                f"{_share(values['output_tok_s_ratio'])}"
            )
        t = self.targets
        verdicts = self.targets_met()
        lines.append(
            f"targets at c{t.concurrency}: added ttft p50 <= {t.added_ttft_p50_ms_max:g} ms, "
            f"p99 <= {t.added_ttft_p99_ms_max:g} ms, throughput >= {t.output_tok_s_ratio_min:.0%} of direct: "
            + ", ".join(f"{name} {_verdict(value)}" for name, value in verdicts.items())
        )
        return "\n".join(lines)


def key(system: str, level: int) -> str:
    """A result's key: ``mesh/c16``."""
    return f"{system}/c{level}"


def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value * 1000:>7.1f}ms"


def _added(value: float | None) -> str:
    return f"{'-':>10}" if value is None else f"{value:>+8.1f}ms"


def _share(value: float | None) -> str:
    return f"{'-':>7}" if value is None else f"{value:>7.0%}"


def _verdict(value: bool | None) -> str:
    return "-" if value is None else ("met" if value else "missed")
