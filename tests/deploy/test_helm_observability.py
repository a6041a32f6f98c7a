"""The chart's traces and logs: every plane's container gets the OTLP
collector, the trace sample ratio and the log format from the values'
``observability`` block (JSON logs by default), the values schema refuses
wrong ones by their path, and a component ``env`` naming one of them fails
the render rather than shipping two conflicting values."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest

from tests.deploy.helm_render import (
    EXAMPLES,
    Manifest,
    containers,
    example_values,
    merge,
    render,
    render_example,
)

PLANES = ("global", "region", "engine", "edge")
COLLECTOR = "http://otel-collector.observability:4317"
TRACED = {"observability": {"otlpEndpoint": COLLECTOR, "traceSampleRatio": 0.25}}


def plane_env(manifests: list[Manifest]) -> dict[str, dict[str, str]]:
    """Each plane container's literal environment, by the plane it runs."""
    found: dict[str, dict[str, str]] = {}
    for workload in manifests:
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for container in containers(workload):
            args = container.get("args") or [""]
            if args[0] in PLANES:
                env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
                found[f"{workload['metadata']['name']}/{args[0]}"] = env
    return found


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_every_plane_logs_json_and_traces_nowhere_by_default(values_file: str) -> None:
    planes = plane_env(render_example(values_file))
    assert len(planes) >= (1 if values_file == "values-global.yaml" else 3)
    for name, env in planes.items():
        assert env["LLMMESH_LOG_FORMAT"] == "json", name
        assert env["LLMMESH_OTLP_ENDPOINT"] == "", name
        assert env["LLMMESH_TRACE_SAMPLE_RATIO"] == "1", name


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_every_plane_traces_to_the_configured_collector(values_file: str) -> None:
    overlay = merge(TRACED, {"observability": {"logFormat": "text"}})
    planes = plane_env(render_example(values_file, overlay))
    assert planes
    for name, env in planes.items():
        assert env["LLMMESH_OTLP_ENDPOINT"] == COLLECTOR, name
        assert env["LLMMESH_TRACE_SAMPLE_RATIO"] == "0.25", name
        assert env["LLMMESH_LOG_FORMAT"] == "text", name


@pytest.mark.parametrize("values_file", [f for f in EXAMPLES if f != "values-global.yaml"])
def test_a_zone_bound_planes_spans_name_its_zone_and_region(values_file: str) -> None:
    values = example_values(values_file)
    placement = f"llmmesh.zone={values['region']['zone']},llmmesh.region={values['region']['name']}"
    planes = plane_env(render_example(values_file))
    zone_bound = {name for name in planes if name.endswith(("/region", "/engine"))}
    assert any(n.endswith("/region") for n in zone_bound) and any(n.endswith("/engine") for n in zone_bound)
    for name, env in planes.items():
        assert env.get("OTEL_RESOURCE_ATTRIBUTES") == (placement if name in zone_bound else None), name


@pytest.mark.parametrize(
    ("overlay", "named"),
    [
        ({"observability": {"logFormat": "yaml"}}, "/observability/logFormat"),
        ({"observability": {"traceSampleRatio": 1.5}}, "/observability/traceSampleRatio"),
        ({"observability": {"otlpEndpoint": "collector:4317"}}, "/observability/otlpEndpoint"),
        ({"observability": {"sampleRate": 1}}, "sampleRate"),
    ],
)
def test_a_wrong_observability_value_fails_the_render_naming_it(overlay: dict[str, Any], named: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(named)):
        render(merge(example_values("values-us.yaml"), overlay))


@pytest.mark.parametrize("component", ["region", "edge"])
def test_a_component_env_setting_an_observability_variable_fails_the_render(component: str) -> None:
    values = merge(example_values("values-us.yaml"), {component: {"env": {"LLMMESH_LOG_FORMAT": "text"}}})
    with pytest.raises(helm_python.HelmError, match="LLMMESH_LOG_FORMAT is set by the observability values"):
        render(values)


PLANE_WORKLOADS = ("global", "region", "edge", "engine")


def _pod_templates(manifests: list[Manifest]) -> dict[str, Manifest]:
    """The pod template of each workload, by its component label."""
    workloads = [m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]
    return {
        w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: w["spec"]["template"]
        for w in workloads
    }


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_every_plane_is_scraped_on_a_port_it_serves(values_file: str) -> None:
    for component, pod in _pod_templates(render_example(values_file)).items():
        if not component.startswith(PLANE_WORKLOADS):
            continue
        annotations = pod["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", component
        container = pod["spec"]["containers"][0]
        served = {int(p["containerPort"]) for p in container.get("ports", [])}
        served |= {int(e["value"]) for e in container["env"] if e["name"] == "LLMMESH_METRICS_PORT"}
        assert int(annotations["prometheus.io/port"]) in served, component


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_replicas_spread_across_zones_and_nodes(values_file: str) -> None:
    for component, pod in _pod_templates(render_example(values_file)).items():
        constraints = pod["spec"]["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in constraints] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        for constraint in constraints:
            # Each counts the component's own pods, nothing else.
            assert constraint["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"


def test_a_component_s_own_spread_replaces_the_default_and_it_can_be_turned_off() -> None:
    own = [{"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}]
    pods = _pod_templates(render_example("values-us.yaml", {"edge": {"topologySpreadConstraints": own}}))
    assert pods["edge"]["spec"]["topologySpreadConstraints"] == own
    assert (
        pods["region"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    )
    off = _pod_templates(render_example("values-us.yaml", {"topologySpread": {"enabled": False}}))
    assert all("topologySpreadConstraints" not in pod["spec"] for pod in off.values())
