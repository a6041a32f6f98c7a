"""What ``llmmesh bench fleet`` reports: per system, cost per turn, time to
first token and the share of turns each model served; the ratios of
``auto`` to always-large, and whether the targets were met."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from llmmesh.bench.stats import percentile
from llmmesh.core.pricing import format_usd

COST_TARGET = 0.40
"""auto must cost at least this much less per turn than always-large."""


@dataclass
class TurnResult:
    """One turn as the client saw it."""

    kind: str
    ttft_s: float | None = None
    model: str = ""
    reason: str = ""
    cost_usd: Decimal = Decimal(0)
    error: str = ""


@dataclass
class SystemResult:
    """Every turn one system served."""

    turns: list[TurnResult] = field(default_factory=list)

    def metrics(self) -> dict[str, object]:
        done = [t for t in self.turns if not t.error]
        ttfts = [t.ttft_s for t in done if t.ttft_s is not None]
        cost = sum((t.cost_usd for t in done), Decimal(0))
        served = Counter(t.model for t in done)
        reasons = Counter(t.reason for t in done if t.reason)

        def p(q: float) -> float | None:
            return round(percentile(ttfts, q), 6) if ttfts else None

        return {
            "turns": len(done),
            "errors": len(self.turns) - len(done),
            "cost_usd": format_usd(cost),
            "cost_per_turn_usd": float(cost / len(done)) if done else None,
            "ttft_p50_s": p(50),
            "ttft_p90_s": p(90),
            "ttft_p90_s_by_kind": {
                kind: round(percentile(values, 90), 6)
                for kind in sorted({t.kind for t in done})
                if (values := [t.ttft_s for t in done if t.kind == kind and t.ttft_s is not None])
            },
            "share_by_model": {m: round(n / len(done), 4) for m, n in sorted(served.items())} if done else {},
            "route_reasons": dict(sorted(reasons.items())),
        }


@dataclass
class FleetReport:
    """The run's results, ratios and targets."""

    workload: dict[str, object]
    results: dict[str, SystemResult]

    def as_dict(self) -> dict[str, object]:
        metrics = {name: result.metrics() for name, result in self.results.items()}
        auto, large = metrics.get("auto", {}), metrics.get("always_large", {})
        ratios: dict[str, float | None] = {"auto_cost_vs_large": None, "auto_ttft_p90_vs_large": None}
        if auto.get("cost_per_turn_usd") and large.get("cost_per_turn_usd"):
            ratios["auto_cost_vs_large"] = round(
                float(auto["cost_per_turn_usd"]) / float(large["cost_per_turn_usd"]),  # type: ignore[arg-type]
                4,
            )
        if auto.get("ttft_p90_s") and large.get("ttft_p90_s"):
            ratios["auto_ttft_p90_vs_large"] = round(
                float(auto["ttft_p90_s"]) / float(large["ttft_p90_s"]),  # type: ignore[arg-type]
                4,
            )
        cost_ratio, ttft_ratio = ratios["auto_cost_vs_large"], ratios["auto_ttft_p90_vs_large"]
        targets = {
            "cost_at_least_40pct_lower_than_large": cost_ratio is not None and cost_ratio <= 1 - COST_TARGET,
            "ttft_p90_no_worse_than_large": ttft_ratio is not None and ttft_ratio <= 1.0,
        }
        return {
            "scenario": "fleet",
            "workload": self.workload,
            "results": metrics,
            "ratios": ratios,
            "targets": targets,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        data = self.as_dict()
        results: dict[str, dict[str, object]] = data["results"]  # type: ignore[assignment]
        lines = [f"fleet: {self.workload}"]
        lines.append(
            f"{'system':<14}{'cost/turn USD':>15}{'ttft p50 s':>12}{'ttft p90 s':>12}{'errors':>8}  served"
        )
        for name, m in results.items():
            share = ", ".join(f"{k} {v:.0%}" for k, v in m["share_by_model"].items())  # type: ignore[attr-defined]
            lines.append(
                f"{name:<14}{m['cost_per_turn_usd']!s:>15.10}{m['ttft_p50_s']!s:>12}"
                f"{m['ttft_p90_s']!s:>12}{m['errors']!s:>8}  {share}"
            )
        lines.append(f"ratios: {data['ratios']}")
        lines.append(f"targets: {data['targets']}")
        return "\n".join(lines)
