"""The chart keeps the mesh up through disruptions and says when it cannot
serve: edges, regions and the global plane run two replicas each under a
PodDisruptionBudget, spread across zones and nodes; readiness asks what
follows the planes' dependencies while liveness asks only the process;
PodMonitors scrape every plane on the port it serves /metrics on, and
prometheus-adapter's rules serve the autoscalers' metrics; a corporate CA
bundle reaches every outbound TLS client. Prometheus Operator objects are
not in the Kubernetes schemas kubernetes_validate knows: their shape is
checked here against the fields the operator's CRD defines."""

from __future__ import annotations

import copy
import json
from typing import Any

import helm_python
import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from llmmesh.region import metrics as region_metrics
from llmmesh.region import metrics_gauges  # noqa: F401  (registers the region's gauges)
from tests.deploy.helm_render import (
    EXAMPLES,
    KUBERNETES_VERSION,
    Manifest,
    containers,
    example_values,
    merge,
    objects,
    render,
)
from tests.deploy.helm_render import render_example as _render_example

MONITORED = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}}
ADAPTER = {"monitoring": {"prometheusAdapter": {"enabled": True, "namespace": "monitoring"}}}
TRUSTED = {"trustBundle": {"secretName": "corporate-ca", "key": "ca.pem"}}
TRUST_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PGSSLROOTCERT", "OTEL_EXPORTER_OTLP_CERTIFICATE")
PLANES = ("global", "region", "engine", "edge")

# The PodMonitor fields this chart uses, as monitoring.coreos.com/v1's CRD
# defines them; unknown fields refused, as the API server's structural schema does.
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
POD_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {
                                "type": "string",
                                "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                        },
                    },
                },
            },
        },
    },
}


_RENDERED: dict[tuple[str, str], list[Manifest]] = {}


def render_example(values_file: str, overlay: dict[str, Any] | None = None) -> list[Manifest]:
    """The example rendered with ``overlay``, once per module (a render takes half a second)."""
    key = (values_file, json.dumps(overlay or {}, sort_keys=True))
    if key not in _RENDERED:
        _RENDERED[key] = _render_example(values_file, overlay)
    return copy.deepcopy(_RENDERED[key])


def _env(container: Manifest) -> dict[str, Manifest]:
    return {item["name"]: item for item in container.get("env", [])}


def _workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]


def _component(workload: Manifest) -> str:
    component: str = workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    return component


def _selects(selector: Manifest, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        present = expression["key"] in labels
        if expression["operator"] == "Exists" and not present:
            return False
        if expression["operator"] == "DoesNotExist" and present:
            return False
    return True


@pytest.mark.parametrize(
    ("values_file", "components"),
    [
        ("values-us.yaml", ("edge", "region")),
        ("values-eu.yaml", ("edge", "region")),
        ("values-global.yaml", ("global",)),
    ],
)
def test_edges_regions_and_the_global_plane_run_two_replicas_each_under_a_disruption_budget(
    values_file: str, components: tuple[str, ...]
) -> None:
    manifests = render_example(values_file)
    budgets = objects(manifests, "PodDisruptionBudget")
    deployments = {_component(d): d for d in objects(manifests, "Deployment").values()}
    for component in components:
        deployment = deployments[component]
        assert deployment["spec"]["replicas"] >= 2, component
        (budget,) = [b for b in budgets.values() if b["metadata"]["name"].endswith(f"-{component}")]
        assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        # A drain may take one replica, never the last.
        assert 0 < budget["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]
        # Replicas spread across zones and nodes, so one failure takes one of them.
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for constraint in spread:
            assert constraint["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_global_plane_scales_past_two_replicas() -> None:
    values = merge(
        example_values("values-global.yaml"), {"globalPlane": {"replicas": 3, "maxUnavailable": 2}}
    )
    manifests = render(values, "llmmesh-global", "llmmesh-global")
    (deployment,) = objects(manifests, "Deployment").values()
    (budget,) = objects(manifests, "PodDisruptionBudget").values()
    assert (deployment["spec"]["replicas"], budget["spec"]["maxUnavailable"]) == (3, 2)


def test_readiness_follows_dependencies_and_liveness_only_the_process() -> None:
    manifests = render_example("values-us.yaml")
    deployments = {_component(d): d for d in objects(manifests, "Deployment").values()}
    edge = deployments["edge"]["spec"]["template"]["spec"]["containers"][0]
    assert edge["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert edge["livenessProbe"]["tcpSocket"] == {"port": "http"}
    region = deployments["region"]["spec"]["template"]["spec"]["containers"][0]
    assert region["readinessProbe"]["grpc"]["service"] == "llmmesh.v1.ChatService"
    assert "service" not in region["livenessProbe"]["grpc"]


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_a_pod_monitor_scrapes_every_plane_on_the_port_it_serves_metrics_on(values_file: str) -> None:
    manifests = render_example(values_file, MONITORED)
    monitors = objects(manifests, "PodMonitor")
    assert monitors
    namespace = manifests[0]["metadata"]["namespace"]
    for monitor in monitors.values():
        jsonschema.validate(monitor, POD_MONITOR)
        assert monitor["metadata"]["namespace"] == namespace
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    planes = [w for w in _workloads(manifests) if _component(w).startswith(PLANES)]
    # Global; or region, edge and each engine pool.
    assert len(planes) >= (1 if values_file == "values-global.yaml" else 3)
    for workload in _workloads(manifests):
        pod = workload["spec"]["template"]
        chosen = [m for m in monitors.values() if _selects(m["spec"]["selector"], pod["metadata"]["labels"])]
        if workload not in planes:
            assert chosen == [], _component(workload)  # Envoy serves no /metrics
            continue
        (monitor,) = chosen
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        container = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert endpoint["port"] in ports, _component(workload)
        served = int(_env(container).get("LLMMESH_METRICS_PORT", {}).get("value", 0))
        # The planes serve /metrics on their metrics port; the edge on its HTTP port.
        assert ports[endpoint["port"]] == (served or int(_env(container)["LLMMESH_PORT"]["value"]))
        assert endpoint["path"] == "/metrics"
    # Off by default: the CRDs may not be installed.
    assert objects(render_example(values_file), "PodMonitor") == {}


def test_the_pod_monitor_shape_check_refuses_a_misspelt_field() -> None:
    monitor = next(iter(objects(render_example("values-us.yaml", MONITORED), "PodMonitor").values()))
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, POD_MONITOR)


def test_prometheus_adapter_rules_serve_the_autoscalers_metrics() -> None:
    manifests = render_example("values-global.yaml", ADAPTER)
    (config_map,) = objects(manifests, "ConfigMap").values()
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)
    assert config_map["metadata"]["namespace"] == "monitoring"
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["externalRules"]
    served = {rule["seriesQuery"].split("{")[0] for rule in rules}
    for rule in rules:
        assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}}}
        assert "<<.Series>>" in rule["metricsQuery"]
    # Every metric an engine pool's autoscaler asks for, and the region exports it.
    scalers = objects(render_example("values-us.yaml"), "HorizontalPodAutoscaler")
    asked = {m["external"]["metric"]["name"] for s in scalers.values() for m in s["spec"]["metrics"]}
    assert asked == served
    registry: CollectorRegistry = region_metrics.REGISTRY
    exported = {family.name for family in registry.collect()}
    assert served <= exported
    assert objects(render_example("values-global.yaml"), "ConfigMap") == {}


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_a_corporate_ca_bundle_reaches_every_outbound_tls_client(values_file: str) -> None:
    manifests = render_example(values_file, TRUSTED)
    checked = 0
    for workload in [*_workloads(manifests), *objects(manifests, "Job").values()]:
        kubernetes_validate.validate(workload, KUBERNETES_VERSION, strict=True)
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in containers(workload):
            args = container.get("args") or [""]
            if args[0] not in (*PLANES, "db"):
                continue
            env = _env(container)
            for name in TRUST_VARIABLES:
                assert env[name]["value"] == "/etc/llmmesh/trust/ca.pem", (container["name"], name)
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/llmmesh/trust"]
            assert mount["readOnly"] is True
            assert volumes[mount["name"]]["secret"]["secretName"] == "corporate-ca"
            assert volumes[mount["name"]]["secret"]["items"] == [{"key": "ca.pem", "path": "ca.pem"}]
            checked += 1
    # Every plane, and the migration Job that opens the store.
    assert checked >= (2 if values_file == "values-global.yaml" else 4)
    plain = render_example(values_file)
    assert all(
        name not in _env(c) for w in _workloads(plain) for c in containers(w) for name in TRUST_VARIABLES
    )


def test_a_ca_bundle_from_a_config_map_works_and_naming_both_fails() -> None:
    config_map = {"trustBundle": {"configMapName": "corporate-ca"}}
    region = next(
        w for w in _workloads(render_example("values-us.yaml", config_map)) if _component(w) == "region"
    )
    volumes = {v["name"]: v for v in region["spec"]["template"]["spec"]["volumes"]}
    assert volumes["trust"]["configMap"]["name"] == "corporate-ca"
    both = {"trustBundle": {"configMapName": "corporate-ca", "secretName": "corporate-ca"}}
    with pytest.raises(helm_python.HelmError, match="not both"):
        render(merge(example_values("values-us.yaml"), both))


def _values(overlay: dict[str, Any]) -> dict[str, Any]:
    return merge(example_values("values-us.yaml"), overlay)


@pytest.mark.parametrize(
    ("overlay", "named"),
    [
        ({"monitoring": {"podMonitor": {"interval": "30"}}}, "/monitoring/podMonitor/interval"),
        ({"monitoring": {"serviceMonitor": {"enabled": True}}}, "serviceMonitor"),
        ({"trustBundle": {"secret": "ca"}}, "secret"),
    ],
)
def test_a_wrong_monitoring_or_trust_value_fails_the_render_naming_it(
    overlay: dict[str, Any], named: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=named):
        render(_values(overlay))
