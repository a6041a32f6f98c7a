"""Prometheus rules and Grafana dashboards of deploy/, checked offline:
``promtool check rules`` on the rules and on every dashboard expression,
``promtool test rules`` on the alerts' unit tests, and every series they read
is one the mesh exports (read from the planes' registries)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from llmmesh.edge import metrics as edge_metrics
from llmmesh.engine.sim.metrics import SchedulerStats, SimEngineMetrics
from llmmesh.globalplane import metrics as global_metrics
from llmmesh.region import metrics as region_metrics
from llmmesh.region import metrics_gauges  # noqa: F401  (registers the region's gauges)
from llmmesh.topology.yaml_text import to_yaml
from tests.deploy.dashboards import (
    PROMETHEUS,
    all_panel_queries,
    dashboard_files,
    metric_names,
    panel_queries,
)

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: bash scripts/setup.sh installs Debian's prometheus package"
    return found


def exported_series() -> set[str]:
    """Every series name the edge, region, global plane and a simulated pod export."""
    sim = SimEngineMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 0, 0, 0)).registry
    names: set[str] = set()
    registries: list[CollectorRegistry] = [
        edge_metrics.REGISTRY,
        region_metrics.REGISTRY,
        global_metrics.REGISTRY,
        sim,
    ]
    for registry in registries:
        for family in registry.collect():
            names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def rule_files() -> list[Path]:
    return sorted((PROMETHEUS / "rules").glob("*.yml"))


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", *map(str, rule_files())], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_pass_their_unit_tests() -> None:
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    assert tests
    result = subprocess.run(
        [promtool(), "test", "rules", *(t.name for t in tests)],
        cwd=PROMETHEUS / "tests",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_finds_a_failing_alert_test(tmp_path: Path) -> None:
    """The unit tests can fail: an alert expected where none fires is reported."""
    failing = tmp_path / "failing.test.yml"
    rules = [str(path) for path in rule_files()]
    test = {
        "rule_files": rules,
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'llmmesh_global_regions{zone="eu", health="down"}', "values": "0x10"}
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "LlmmeshRegionDown", "exp_alerts": [{"exp_labels": {}}]}
                ],
            }
        ],
    }
    failing.write_text(to_yaml(test))
    result = subprocess.run(
        [promtool(), "test", "rules", str(failing)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "LlmmeshRegionDown" in result.stdout + result.stderr


def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    queries = all_panel_queries()
    assert len(queries) >= 20
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [{"record": f"dashboard:check_{n}", "expr": q.expr} for n, q in enumerate(queries)],
            }
        ]
    }
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(to_yaml(rules))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.stem)
def test_a_dashboard_reads_only_series_the_mesh_exports(path: Path) -> None:
    exported = exported_series()
    for query in panel_queries(path):
        read = metric_names(query.expr)
        assert read, f"no llmmesh or vLLM series in {query}"
        assert read <= exported, f"{query} reads {sorted(read - exported)}, which no plane exports"


def test_the_rules_read_only_series_the_mesh_exports() -> None:
    exported = exported_series()
    for path in rule_files():
        rules = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        read = metric_names(rules)
        assert read <= exported, f"{path.name} reads {sorted(read - exported)}"
