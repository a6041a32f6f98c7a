"""The Grafana dashboards of deploy/grafana as queries: every panel target's
PromQL with its template variables replaced as Grafana would for "All"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = DEPLOY / "grafana"
PROMETHEUS = DEPLOY / "prometheus"
# Grafana's built-in interval variables, at values that suit a short scrape interval.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
METRIC_NAME = re.compile(r"\b(llmmesh_[a-z0-9_]+|vllm:[a-z0-9_:]+)")


@dataclass(frozen=True)
class PanelQuery:
    """One panel target: where it is and its PromQL, variables replaced."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}: {self.expr}"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in panels:
        found.append(panel)
        found += _panels(panel.get("panels", []))
    return found


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``$name`` and ``${name}`` replaced by their values (query variables by their "All" value)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"unknown template variable {name!r} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def panel_queries(path: Path) -> list[PanelQuery]:
    doc = json.loads(path.read_text())
    variables = dict(BUILTINS)
    for variable in doc.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            variables[variable["name"]] = variable.get("allValue") or ".*"
    queries = []
    for panel in _panels(doc["panels"]):
        for target in panel.get("targets", []):
            queries.append(
                PanelQuery(doc["uid"], panel["title"], target["refId"], substitute(target["expr"], variables))
            )
    return queries


def all_panel_queries() -> list[PanelQuery]:
    return [query for path in dashboard_files() for query in panel_queries(path)]


def metric_names(expr: str) -> set[str]:
    """The llmmesh and vLLM series an expression reads."""
    return set(METRIC_NAME.findall(expr))
