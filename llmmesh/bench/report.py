"""The report of a benchmark that measures us against a peer: the figures of
every system at every level, our figures as ratios of the peer's, and
whether the targets hold. Rendered as MISSION's one JSON line or a table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmmesh.bench.stats import LevelMetrics

# Ours / peer. For output_tok_s higher is better; for the latencies lower is.
RATIO_METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s")

Ratios = dict[str, float | None]


def ratio(ours: float | None, peer: float | None) -> float | None:
    """``ours / peer``, or None when either is missing or the peer's is 0."""
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


def compare(ours: LevelMetrics, peer: LevelMetrics) -> Ratios:
    """Our figures over the peer's, for each of :data:`RATIO_METRICS`."""
    return {name: ratio(getattr(ours, name), getattr(peer, name)) for name in RATIO_METRICS}


@dataclass(frozen=True)
class Targets:
    """What "as good as the peer" means: at least this share of its
    throughput and at most this multiple of its median TTFT."""

    output_tok_s_ratio_min: float = 0.95
    ttft_p50_ratio_max: float = 1.1

    def met(self, ratios: Ratios) -> bool:
        """Both targets hold; a missing ratio does not."""
        throughput = ratios.get("output_tok_s")
        ttft = ratios.get("ttft_p50_s")
        return (
            throughput is not None
            and ttft is not None
            and throughput >= self.output_tok_s_ratio_min
            and ttft <= self.ttft_p50_ratio_max
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "output_tok_s_ratio_min": self.output_tok_s_ratio_min,
            "ttft_p50_ratio_max": self.ttft_p50_ratio_max,
        }


@dataclass(frozen=True)
class BenchReport:
    """Results keyed ``{system}/{level}`` (e.g. ``llmmesh/c8``), in the order
    they are shown; ratios and target verdicts keyed by level."""

    scenario: str
    model: str
    ours: str
    peer: str
    levels: Sequence[str]
    results: Mapping[str, LevelMetrics]
    targets: Targets = field(default_factory=Targets)
    # Scenario-specific figures beside the results (e.g. speculative
    # decoding's acceptance), shown as they are; empty for none.
    extra: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for level in self.levels:
            for system in (self.ours, self.peer):
                if f"{system}/{level}" not in self.results:
                    raise ValueError(f"no result for {system}/{level}")

    def ratios(self) -> dict[str, Ratios]:
        return {
            level: compare(self.results[f"{self.ours}/{level}"], self.results[f"{self.peer}/{level}"])
            for level in self.levels
        }

    def as_dict(self) -> dict[str, object]:
        """MISSION's report object: scenario, model, results, ratios,
        targets, targets_met."""
        ratios = self.ratios()
        return {
            "scenario": self.scenario,
            "model": self.model,
            "results": {
                f"{system}/{level}": self.results[f"{system}/{level}"].as_dict()
                for level in self.levels
                for system in (self.ours, self.peer)
            },
            "ratios": {
                level: {name: None if value is None else round(value, 4) for name, value in values.items()}
                for level, values in ratios.items()
            },
            "targets": self.targets.as_dict(),
            "targets_met": {level: self.targets.met(values) for level, values in ratios.items()},
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    def to_json(self) -> str:
        """One line of strict JSON (no NaN)."""
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        """The same figures as a plain-text table for people."""
        lines = [
            f"{self.scenario} benchmark, model {self.model}",
            "",
            f"{'system/level':<20} {'reqs':>5} {'errs':>5} {'out tok':>8} {'out tok/s':>10} "
            f"{'ttft p50':>9} {'ttft p90':>9} {'ttft p99':>9} {'itl p50':>9}",
        ]
        for level in self.levels:
            for system in (self.ours, self.peer):
                m = self.results[f"{system}/{level}"]
                lines.append(
                    f"{system + '/' + level:<20} {m.requests:>5} {m.errors:>5} {m.output_tokens:>8} "
                    f"{m.output_tok_s:>10.1f} {_seconds(m.ttft_p50_s)} {_seconds(m.ttft_p90_s)} "
                    f"{_seconds(m.ttft_p99_s)} {_seconds(m.itl_p50_s)}"
                )
        lines += [
            "",
            f"ratios {self.ours} / {self.peer}",
            f"{'level':<8} {'out tok/s':>10} {'ttft p50':>9} {'ttft p90':>9} {'itl p50':>9}  targets met",
        ]
        for level, values in self.ratios().items():
            cells = " ".join(
                f"{_ratio(values[name]):>{10 if i == 0 else 9}}" for i, name in enumerate(RATIO_METRICS)
            )
            verdict = "yes" if self.targets.met(values) else "no"
            lines.append(f"{level:<8} {cells}  {verdict}")
        lines.append(
            f"targets: output_tok_s ratio >= {self.targets.output_tok_s_ratio_min}, "
            f"ttft_p50 ratio <= {self.targets.ttft_p50_ratio_max}"
        )
        lines += [f"{name}: {json.dumps(value)}" for name, value in self.extra.items()]
        return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value * 1000:>7.1f}ms"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
