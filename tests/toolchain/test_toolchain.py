"""The repository's checkers run inside the test command: buf, ruff, mypy,
import-linter, and the freshness of the generated code."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.toolchain


def run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{' '.join(result.args)} failed:\n{result.stdout}\n{result.stderr}"


def test_buf_lint() -> None:
    assert_clean(run(str(BIN / "buf"), "lint"))


def test_buf_format() -> None:
    assert_clean(run(str(BIN / "buf"), "format", "-d", "--exit-code"))


def _landed_proto_revisions(limit: int = 20) -> list[str]:
    result = run("git", "log", f"-n{limit}", "--format=%H", "--", "protos")
    if result.returncode != 0:
        return []
    return result.stdout.split()


@pytest.mark.slow
def test_buf_breaking_against_landed_protos() -> None:
    """No change breaks the contract of any recent commit that touched it."""
    revisions = _landed_proto_revisions()
    if not revisions:
        pytest.skip("no committed protos to compare against")
    for rev in revisions:
        # A revision whose protos never built (one file of a two-file change
        # landed before the other) had no contract a client could use.
        if run(str(BIN / "buf"), "build", f".git#ref={rev}").returncode != 0:
            continue
        assert_clean(run(str(BIN / "buf"), "breaking", "--against", f".git#ref={rev}"))


def test_ruff_lint() -> None:
    assert_clean(run(str(BIN / "ruff"), "check", "."))


def test_ruff_format() -> None:
    assert_clean(run(str(BIN / "ruff"), "format", "--check", "."))


# A cold strict run of the whole tree takes 2 to 5 minutes on two shared cores.
@pytest.mark.timeout(900)
def test_mypy_strict() -> None:
    assert_clean(run(str(BIN / "mypy"), timeout=840))


def test_import_contracts() -> None:
    assert_clean(run(str(BIN / "lint-imports")))


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    """The committed llmmesh/v1 equals what scripts/genproto.py makes now."""
    assert_clean(run(sys.executable, "scripts/genproto.py", "--out", str(tmp_path)))
    fresh = tmp_path / "llmmesh" / "v1"
    committed = ROOT / "llmmesh" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in committed.iterdir() if p.name != "__pycache__")
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale generated files {mismatch + errors}: run scripts/genproto.py"
