"""Render deploy/helm/llmmesh offline with Helm's own template engine (the
libhelm that helm-python-sdk bundles; no helm binary, no cluster)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "llmmesh"
EXAMPLES = ("values-global.yaml", "values-us.yaml", "values-eu.yaml")
KUBERNETES_VERSION = "1.32.0"
# Production pins images by digest; the examples name tags.
PINNED_IMAGES = {"images": {name: {"digest": "sha256:" + "0" * 64} for name in ("mesh", "engine", "envoy")}}

Manifest = dict[str, Any]


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, maps merged key by key (as Helm's -f does)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def example_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = helm_python.values_from_yaml((CHART / name).read_text())
    return values


def release_of(values_file: str) -> tuple[str, str]:
    """The release name and namespace an example's header installs it as."""
    stem = values_file.removeprefix("values-").removesuffix(".yaml")
    name = {"global": "llmmesh-global", "us": "llmmesh-us-east", "eu": "llmmesh-eu-west"}[stem]
    return name, name


def render(values: Mapping[str, Any], name: str = "llmmesh", namespace: str = "llmmesh") -> list[Manifest]:
    """Every object the chart renders for ``values``, in template order."""
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(dict(values), name=name, namespace=namespace, is_install=True)
    return list(_documents(rendered))


def render_text(values: Mapping[str, Any], name: str = "llmmesh", namespace: str = "llmmesh") -> str:
    """The rendered objects as one multi-document YAML stream."""
    return "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in render(values, name, namespace))


def render_example(values_file: str, overlay: Mapping[str, Any] | None = None) -> list[Manifest]:
    name, namespace = release_of(values_file)
    return render(merge(example_values(values_file), overlay or {}), name, namespace)


def _documents(rendered: Mapping[str, str]) -> Iterator[Manifest]:
    for path in sorted(rendered):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc:
                yield doc


def objects(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    """The objects of one kind, by name."""
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def containers(manifest: Manifest) -> list[Manifest]:
    """A workload's containers, init containers included."""
    spec = manifest["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]
