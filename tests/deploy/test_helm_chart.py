"""The Helm chart deploy/helm/llmmesh: rendered offline by Helm's own
template engine for each example values file, every object valid against
the Kubernetes OpenAPI schemas, clean under ``helm lint`` and checkov, and
wired as the planes read it (every LLMMESH_* variable is a setting, every
engine pod is dialled by its region, probes ask grpc.health.v1, drains
outlast preStop, the autoscaler scales the pool it names)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from llmmesh.cli.main import main
from llmmesh.core.json_logs import LogSettings
from llmmesh.core.tracing import TracingSettings
from llmmesh.edge.settings import EdgeSettings
from llmmesh.engine.settings import EngineSettings
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.region.server import SERVICE_NAME as REGION_SERVICE
from llmmesh.region.settings import RegionSettings
from llmmesh.topology import envoy_config
from llmmesh.topology.envoy_tls import ProxyTls, sds_documents
from tests.deploy.helm_render import (
    CHART,
    EXAMPLES,
    KUBERNETES_VERSION,
    PINNED_IMAGES,
    ROOT,
    Manifest,
    containers,
    example_values,
    merge,
    objects,
    render,
    render_example,
    render_text,
)

SETTINGS: dict[str, type[Any]] = {
    "global": GlobalSettings,
    "region": RegionSettings,
    "engine": EngineSettings,
    "edge": EdgeSettings,
}
# Variables read outside the settings objects: the home, and the traces and
# logs settings every plane's command reads (llmmesh/cli/main.py).
PROCESS_VARIABLES = {"LLMMESH_HOME"} | {
    "LLMMESH_" + f.name.upper() for each in (TracingSettings, LogSettings) for f in dataclasses.fields(each)
}
# Readiness asks the service a plane reports NOT_SERVING while a dependency
# is down (llmmesh/region/readiness.py); liveness the server-wide status.
READINESS_SERVICE = {"region": {"service": REGION_SERVICE}}
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
# --skip-download: nothing fetched from the vendor's service (offline, as CI is).
CHECKOV_OPTIONS = ("--quiet", "--compact", "--skip-download", "--output", "json")
# Every field's value in the example secret; the chart refuses empty ones.
SECRET_VALUES = {
    "secrets": {
        "create": True,
        "values": {
            "databaseUrl": "cockroachdb://llmmesh@crdb:26257/llmmesh",
            "zoneStoreUrl": "cockroachdb://llmmesh@crdb:26257/llmmesh",
            "redisUrl": "redis://redis:6379/0",
            "devKey": "sk-test",
        },
    },
    "globalPlane": {"devTenant": {"enabled": True}},
}


def _validate(manifest: Manifest) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def _one(manifests: list[Manifest], kind: str, suffix: str) -> Manifest:
    """The one object of ``kind`` whose name ends in ``suffix``."""
    (found,) = [m for name, m in objects(manifests, kind).items() if name.endswith(suffix)]
    return found


def _env(container: Manifest) -> dict[str, Manifest]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_every_rendered_object_is_valid_kubernetes(values_file: str) -> None:
    manifests = render_example(values_file)
    assert manifests
    for manifest in manifests:
        _validate(manifest)
        assert manifest["metadata"]["namespace"] == render_example_namespace(values_file)


def render_example_namespace(values_file: str) -> str:
    from tests.deploy.helm_render import release_of

    return release_of(values_file)[1]


def test_schema_validation_refuses_a_misspelt_field() -> None:
    """The validator the test above trusts does refuse what Kubernetes would."""
    deployment = next(iter(objects(render_example("values-us.yaml"), "Deployment").values()))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"prot": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def test_the_secret_and_plaintext_variants_are_valid_too() -> None:
    for overlay in (SECRET_VALUES, {"mtls": {"enabled": False}}):
        for values_file in EXAMPLES:
            for manifest in render_example(values_file, overlay):
                _validate(manifest)
    secret = objects(render_example("values-us.yaml", SECRET_VALUES), "Secret")
    assert set(secret["llmmesh-us-east-secrets"]["stringData"]) == {"zone-store-url", "redis-url"}
    # The migration Job runs before the release's own Secret exists: its URL comes in a hook Secret.
    hook = secret["llmmesh-us-east-migrate"]
    assert set(hook["stringData"]) == {"zone-store-url"}
    assert hook["metadata"]["annotations"]["helm.sh/hook-weight"] == "-1"


@pytest.mark.parametrize(
    ("values_file", "store_flag"), [("values-global.yaml", "--global-url"), ("values-us.yaml", "--zone-url")]
)
def test_the_migration_job_upgrades_the_releases_store_before_its_planes_start(
    values_file: str, store_flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    regions = ["us:us-east=us-east1", "us:us-west=us-west1"]
    job = next(
        iter(objects(render_example(values_file, {"migrations": {"regions": regions}}), "Job").values())
    )
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = next(e for e in container["env"] if e["name"] == "LLMMESH_STORE_URL")
    assert env["valueFrom"]["secretKeyRef"]["key"] == (
        "database-url" if "global" in values_file else "zone-store-url"
    )
    args = container["args"]
    assert args[:3] == ["db", "upgrade", store_flag]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--region"] == regions
    # The container's command, with the URL Kubernetes puts in place of $(LLMMESH_STORE_URL), migrates.
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main([a.replace("$(LLMMESH_STORE_URL)", url) for a in args if a]) == 0
    assert "empty -> " in capsys.readouterr().out
    # Without regions the locality is left alone (SQLite, PostgreSQL).
    plain = objects(render_example(values_file), "Job")
    assert "--no-locality" in next(iter(plain.values()))["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_missing_secret_value_fails_the_render_naming_it() -> None:
    values = merge(example_values("values-us.yaml"), {"secrets": {"create": True}})
    with pytest.raises(helm_python.HelmError, match=r"secrets\.values\.zoneStoreUrl"):
        render(values)


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_helm_lint_is_clean(values_file: str) -> None:
    report = helm_python.lint(
        CHART, example_values(values_file), strict=True, kube_version=f"v{KUBERNETES_VERSION}"
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.toolchain
def test_checkov_passes_every_example(tmp_path: Path) -> None:
    if not CHECKOV.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{CHECKOV} missing: scripts/setup.sh creates it")
        pytest.skip(f"{CHECKOV} missing: run scripts/setup.sh")
    for values_file in EXAMPLES:
        rendered = tmp_path / values_file
        rendered.write_text(render_text(merge(example_values(values_file), PINNED_IMAGES)))
    result = subprocess.run(
        [str(CHECKOV), "--directory", str(tmp_path), "--framework", "kubernetes", *CHECKOV_OPTIONS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [(c["check_id"], c["resource"]) for each in reports for c in each["results"]["failed_checks"]]
    assert failed == []
    assert sum(each["summary"]["passed"] for each in reports) > 100
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_every_llmmesh_variable_is_a_setting_of_its_plane(values_file: str) -> None:
    """A variable no settings field reads would be ignored without a word."""
    workloads = [m for m in render_example(values_file) if m["kind"] in ("Deployment", "StatefulSet")]
    checked = 0
    for workload in workloads:
        for container in containers(workload):
            args = container.get("args") or [""]
            plane = SETTINGS.get(args[0])
            names = [n for n in _env(container) if n.startswith("LLMMESH_")]
            if plane is None:
                assert names == [], f"{container['name']} is no plane yet sets {names}"
                continue
            fields = {"LLMMESH_" + f.name.upper() for f in dataclasses.fields(plane)}
            assert set(names) - fields - PROCESS_VARIABLES == set(), container["name"]
            checked += 1
    assert checked >= (1 if values_file == "values-global.yaml" else 3)


def test_the_image_s_variables_are_settings_too() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    every_field = {
        "LLMMESH_" + f.name.upper() for plane in SETTINGS.values() for f in dataclasses.fields(plane)
    }
    named = {word.split("=")[0] for word in dockerfile.split() if word.startswith("LLMMESH_")}
    assert named
    assert named - every_field - PROCESS_VARIABLES == set()


@pytest.mark.parametrize("values_file", ["values-us.yaml", "values-eu.yaml"])
def test_the_region_dials_every_engine_pod_the_pools_may_have(values_file: str) -> None:
    values = example_values(values_file)
    manifests = render_example(values_file)
    region = _one(manifests, "Deployment", "-region")
    env = _env(region["spec"]["template"]["spec"]["containers"][0])
    dialled = env["LLMMESH_ENGINE_ADDRESSES"]["value"].split(",")
    assert env["LLMMESH_ZONE"]["value"] == values["region"]["zone"]
    sets = objects(manifests, "StatefulSet")
    expected = []
    for pool in values["engine"]["pools"]:
        name = next(n for n in sets if n.endswith(f"-engine-{pool['name']}"))
        for ordinal in range(pool["autoscaling"]["maxReplicas"]):
            expected.append(
                f"{name}-{ordinal}.{name}.{sets[name]['metadata']['namespace']}.svc.cluster.local:50061"
            )
    assert dialled == expected
    for name, stateful in sets.items():
        engine_env = _env(stateful["spec"]["template"]["spec"]["containers"][0])
        # Each pod advertises the name the region dials: $(POD) expands to it.
        assert engine_env["LLMMESH_ADVERTISE_ADDRESS"]["value"] == (
            f"$(LLMMESH_POD_ID).{name}.{stateful['metadata']['namespace']}.svc.cluster.local:50061"
        )
        assert engine_env["LLMMESH_POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize("values_file", ["values-us.yaml", "values-eu.yaml"])
def test_engine_pods_get_gpus_a_budget_and_an_autoscaler(values_file: str) -> None:
    values = example_values(values_file)
    manifests = render_example(values_file)
    sets = objects(manifests, "StatefulSet")
    budgets = objects(manifests, "PodDisruptionBudget")
    scalers = objects(manifests, "HorizontalPodAutoscaler")
    for pool in values["engine"]["pools"]:
        name = next(n for n in sets if n.endswith(f"-engine-{pool['name']}"))
        pod = sets[name]["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == pool["tensorParallelSize"]
        assert _env(engine)["LLMMESH_TENSOR_PARALLEL_SIZE"]["value"] == str(pool["tensorParallelSize"])
        assert pod["nodeSelector"] == pool["nodeSelector"]
        assert pod["tolerations"] == pool["tolerations"]
        labels = sets[name]["spec"]["selector"]["matchLabels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"] == labels
        scaler = scalers[name]["spec"]
        assert scaler["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name}
        assert (scaler["minReplicas"], scaler["maxReplicas"]) == (
            pool["autoscaling"]["minReplicas"],
            pool["autoscaling"]["maxReplicas"],
        )
        metrics = {m["external"]["metric"]["name"]: m["external"] for m in scaler["metrics"]}
        assert set(metrics) == {"llmmesh_region_queue_depth", "llmmesh_region_kv_usage_ratio"}
        for metric in metrics.values():
            # region/metrics_gauges.py labels a pool by the model its pods serve.
            assert metric["metric"]["selector"]["matchLabels"] == {
                "region": values["region"]["name"],
                "pool": pool["model"],
            }
        # The autoscaler owns the replica count; a fixed one would fight it.
        assert "replicas" not in sets[name]["spec"]


@pytest.mark.parametrize("values_file", EXAMPLES)
def test_grpc_planes_probe_health_and_drain_on_sigterm(values_file: str) -> None:
    probe_port = example_values("values.yaml")["probes"]["port"]
    for workload in render_example(values_file):
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = workload["spec"]["template"]["spec"]
        container = pod["containers"][0]
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        # preStop, then the plane's own 5 s drain, inside the grace period.
        assert pod["terminationGracePeriodSeconds"] >= pre_stop + 5
        plane = container.get("args", [""])[0]
        if plane in ("global", "region", "engine"):
            assert container["livenessProbe"]["grpc"] == {"port": probe_port}
            ready = {"port": probe_port, **READINESS_SERVICE.get(plane, {})}
            assert container["readinessProbe"]["grpc"] == ready
            assert _env(container)["LLMMESH_PROBE_PORT"]["value"] == str(probe_port)


def test_without_mtls_the_probes_ask_the_plane_s_own_port() -> None:
    manifests = render_example("values-us.yaml", {"mtls": {"enabled": False}})
    for workload in manifests:
        if workload["kind"] in ("Deployment", "StatefulSet"):
            container = workload["spec"]["template"]["spec"]["containers"][0]
            plane = container.get("args", [""])[0]
            if plane in ("region", "engine"):
                port = container["ports"][0]["containerPort"]
                assert container["readinessProbe"]["grpc"] == {
                    "port": port,
                    **READINESS_SERVICE.get(plane, {}),
                }
                assert _env(container)["LLMMESH_INSECURE"]["value"] == "true"
                assert "LLMMESH_PROBE_PORT" not in _env(container)


def test_the_envoy_config_is_the_project_s_renderer_s_and_its_sds_files_match(
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifests = render_example("values-us.yaml")
    envoy = _one(manifests, "Deployment", "-envoy")
    init = envoy["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:3] == [
        "sh",
        "-c",
        'python -m llmmesh.topology.envoy_config "$@" > /etc/envoy/envoy.yaml',
    ]
    envoy_config.main(init["args"])
    config = yaml.safe_load(capsys.readouterr().out)
    listeners = config["static_resources"]["listeners"]
    ports = {item["name"]: item["address"]["socket_address"]["port_value"] for item in listeners}
    assert ports == {"http": 10000, "grpc": 10001}
    clusters = {c["name"] for c in config["static_resources"]["clusters"]}
    assert "region-us-east" in clusters
    sds = next(iter(objects(manifests, "ConfigMap").values()))["data"]
    expected = sds_documents(ProxyTls.in_directory("/etc/llmmesh/certs"))
    assert {f"/etc/llmmesh/certs/{name}": yaml.safe_load(text) for name, text in sds.items()} == expected


def test_the_global_release_runs_no_development_tenant_unless_asked() -> None:
    global_plane = next(iter(objects(render_example("values-global.yaml"), "Deployment").values()))
    env = _env(global_plane["spec"]["template"]["spec"]["containers"][0])
    assert env["LLMMESH_DEV_KEY"] == {"name": "LLMMESH_DEV_KEY", "value": ""}
    asked = next(iter(objects(render_example("values-global.yaml", SECRET_VALUES), "Deployment").values()))
    env = _env(asked["spec"]["template"]["spec"]["containers"][0])
    assert env["LLMMESH_DEV_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "dev-key"


@pytest.mark.parametrize(
    ("overlay", "named"),
    [
        ({"engine": {"pool": []}}, "pool"),
        ({"region": {"port": "50052"}}, "/region/port"),
        ({"edge": {"env": {"PORT": "1"}}}, "'PORT' does not match pattern '^LLMMESH_"),
        ({"engine": {"pools": [{"name": "Big_Pool", "model": "m"}]}}, "/engine/pools/0/name"),
        ({"images": {"engine": {"repository": "r", "digest": "latest"}}}, "/images/engine/digest"),
    ],
)
def test_a_wrong_value_fails_the_render_naming_it(overlay: dict[str, Any], named: str) -> None:
    """values.schema.json: a misspelt key, a wrong type or a malformed name
    stops the render with its path, rather than rendering something else."""
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(named)):
        render(merge(example_values("values-us.yaml"), overlay))


def test_a_model_path_outside_the_model_volume_fails_the_render() -> None:
    values = example_values("values-us.yaml")
    values["engine"]["pools"][0]["modelPath"] = "/opt/models/llama"
    with pytest.raises(helm_python.HelmError, match="modelPath must lie under /models"):
        render(values)
