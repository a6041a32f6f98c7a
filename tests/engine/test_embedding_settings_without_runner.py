"""An engine pod that runs no embedding model refuses ``embedding_*``
settings at start instead of ignoring them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmmesh.engine.settings import EngineSettings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("embedding_model", "other-embed"),
        ("embedding_dimensions", 64),
        ("embedding_max_input_tokens", 512),
    ],
)
def test_an_embedding_setting_without_a_runner_is_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{name} \(LLMMESH_{name.upper()}\) is set, but") as info:
        EngineSettings(backend="sim", embedding_backend="none", **{name: value})  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_a_vllm_pod_embeds_nothing_by_default_and_refuses_embedding_settings() -> None:
    with pytest.raises(ValueError, match=r"^embedding_dimensions .* this vllm pod runs no embedding model"):
        EngineSettings(backend="vllm", embedding_dimensions=128)


def test_embedding_settings_are_taken_where_a_runner_uses_them() -> None:
    assert EngineSettings(backend="sim", embedding_dimensions=64).embedding_dimensions == 64
    assert EngineSettings(backend="vllm", embedding_backend="sim", embedding_model="e").embedding_model == "e"
    # The defaults are no setting at all: a pod without a runner starts, also
    # in an image that names where the embedding model's files lie.
    assert EngineSettings(backend="vllm").embedding_runner("vllm") == "none"
    in_image = EngineSettings(backend="vllm", embedding_model_path="/opt/embed")
    assert in_image.embedding_runner("vllm") == "none"


def test_the_engine_command_refuses_it_with_one_line_naming_the_setting(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmmesh.cli.main", "engine", "--embedding-backend", "none"],
        env={"LLMMESH_EMBEDDING_DIMENSIONS": "64", "PATH": "/usr/bin:/bin", "LLMMESH_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "embedding_dimensions (LLMMESH_EMBEDDING_DIMENSIONS) is set" in lines[0]
