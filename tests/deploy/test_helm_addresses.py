"""The chart as the chart's README installs it, with nothing overridden:
every in-cluster address any release's planes dial names a Service the
releases render, on a port that Service has. A pod address
(``<statefulset>-<n>.<service>.<namespace>.svc…``) must name a headless
Service, a StatefulSet governed by it, and an ordinal it can reach."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from tests.deploy.helm_render import CHART, Manifest, example_values, render

README = CHART / "README.md"
ADDRESS = re.compile(r"(?<![\w.-])([a-z0-9][a-z0-9.-]*\.svc\.cluster\.local):(\d+)")


def readme_releases() -> list[tuple[str, str, str]]:
    """(release, namespace, values file) of each ``helm install`` the README shows."""
    releases = []
    for line in README.read_text().splitlines():
        if not line.startswith("helm install "):
            continue
        words = shlex.split(line)
        name, namespace, values = words[2], words[words.index("-n") + 1], words[words.index("-f") + 1]
        assert words[3] == "deploy/helm/llmmesh", line
        releases.append((name, namespace, Path(values).name))
    return releases


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def _replicas_at_most(workload: Manifest, manifests: list[Manifest]) -> int:
    """The most replicas a StatefulSet may have: its autoscaler's maximum, else its own count."""
    name = workload["metadata"]["name"]
    most = int(workload["spec"].get("replicas", 1))
    for hpa in (m for m in manifests if m["kind"] == "HorizontalPodAutoscaler"):
        if hpa["spec"]["scaleTargetRef"]["name"] == name:
            most = max(most, int(hpa["spec"]["maxReplicas"]))
    return most


def unresolved(releases: dict[str, list[Manifest]]) -> list[str]:
    """The dialled addresses no rendered Service answers, with why."""
    services: dict[tuple[str, str], Manifest] = {}
    statefulsets: dict[tuple[str, str], tuple[Manifest, list[Manifest]]] = {}
    for namespace, manifests in releases.items():
        for manifest in manifests:
            key = (manifest["metadata"]["name"], namespace)
            if manifest["kind"] == "Service":
                services[key] = manifest
            elif manifest["kind"] == "StatefulSet":
                statefulsets[key] = (manifest, manifests)
    problems = []
    for namespace, manifests in releases.items():
        for manifest in manifests:
            if manifest["kind"] not in ("Deployment", "StatefulSet", "ConfigMap", "Job"):
                continue
            for text in _strings(manifest):
                for host, port in ADDRESS.findall(text):
                    parts = host.removesuffix(".svc.cluster.local").split(".")
                    where = (
                        f"{manifest['kind']} {manifest['metadata']['name']} ({namespace}) dials {host}:{port}"
                    )
                    if len(parts) == 2:
                        service = services.get((parts[0], parts[1]))
                        pod = None
                    elif len(parts) == 3:
                        service = services.get((parts[1], parts[2]))
                        pod = parts[0]
                    else:
                        problems.append(f"{where}: not a Service or pod name")
                        continue
                    if service is None:
                        problems.append(f"{where}: no such Service")
                        continue
                    if int(port) not in {int(p["port"]) for p in service["spec"]["ports"]}:
                        problems.append(f"{where}: the Service has no port {port}")
                    if pod is not None:
                        problems += _pod_problem(where, pod, service, statefulsets, parts[2])
    return problems


def _pod_problem(
    where: str,
    pod: str,
    service: Manifest,
    statefulsets: dict[tuple[str, str], tuple[Manifest, list[Manifest]]],
    namespace: str,
) -> list[str]:
    if service["spec"].get("clusterIP") != "None":
        return [f"{where}: the Service is not headless, so it names no pod"]
    workload_name, _, ordinal = pod.rpartition("-")
    found = statefulsets.get((workload_name, namespace))
    if found is None or not ordinal.isdigit():
        return [f"{where}: no StatefulSet {workload_name}"]
    workload, manifests = found
    if workload["spec"]["serviceName"] != service["metadata"]["name"]:
        return [f"{where}: StatefulSet {workload_name} is governed by another Service"]
    if int(ordinal) >= _replicas_at_most(workload, manifests):
        return [f"{where}: StatefulSet {workload_name} never has a pod {ordinal}"]
    return []


def test_the_readme_installs_the_global_plane_and_two_regions() -> None:
    assert [values for _, _, values in readme_releases()] == [
        "values-global.yaml",
        "values-us.yaml",
        "values-eu.yaml",
    ]


def test_every_address_a_release_dials_is_a_service_of_the_readme_s_releases() -> None:
    releases = {
        namespace: render(example_values(values), name, namespace)
        for name, namespace, values in readme_releases()
    }
    dialled = [
        address for manifests in releases.values() for m in manifests for address in ADDRESS.findall(str(m))
    ]
    assert any(host.startswith("llmmesh-global.") for host, _ in dialled), "no release dials the global plane"
    assert unresolved(releases) == []


def test_an_address_of_no_service_is_found() -> None:
    """The check fails on the chart as it was: the global release's Service
    was named after the release (llmmesh-global-global), not what regions dial."""
    name, namespace, values = readme_releases()[0]
    releases = {
        namespace: render(
            example_values(values)
            | {
                "globalPlane": {
                    **example_values(values)["globalPlane"],
                    "serviceName": "llmmesh-global-global",
                }
            },
            name,
            namespace,
        )
    }
    for name, namespace, values in readme_releases()[1:]:
        releases[namespace] = render(example_values(values), name, namespace)
    problems = unresolved(releases)
    assert problems and all("llmmesh-global.llmmesh-global.svc.cluster.local:50051" in p for p in problems)
    assert all("no such Service" in p for p in problems)
