"""``llmmesh up --engine vllm --model-path DIR`` checks the directory before
anything starts: a missing one, one without ``config.json``, without a
tokenizer or without a chat template is refused (exit status 2) with one
line naming what is missing; a good one is served under its name (or
``--model-name``) as the mesh's default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmesh.cli.main import main
from llmmesh.cli.served_model import served_model


def model_dir(root: Path, *files: str, positions: int = 2048) -> Path:
    path = root / "my-chat"
    path.mkdir()
    for name in files:
        text = json.dumps({"max_position_embeddings": positions}) if name == "config.json" else "{}"
        (path / name).write_text(text)
    return path


def up(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    status = main(["up", *flags])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ((), "config.json is missing: not a Hugging Face model"),
        (("config.json",), "no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt)"),
        (("config.json", "vocab.json"), "no tokenizer"),
        (("config.json", "tokenizer.json", "tokenizer_config.json"), "no chat template"),
    ],
)
def test_a_directory_that_is_no_chat_model_is_refused_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: tuple[str, ...],
    needle: str,
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path / "home"))
    path = model_dir(tmp_path, *files)
    status, err = up(capsys, "--engine", "vllm", "--model-path", str(path))
    assert status == 2 and err.startswith(f"llmmesh up: --model-path {path}: ") and needle in err
    assert err.count("\n") == 1 and not (tmp_path / "home" / "mesh.json").exists()


def test_the_flags_need_each_other_and_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path / "home"))
    path = model_dir(tmp_path, "config.json", "tokenizer.json", "chat_template.jinja")
    assert up(capsys, "--engine", "vllm", "--model-path", str(tmp_path / "nowhere")) == (
        2,
        f"llmmesh up: --model-path {tmp_path / 'nowhere'}: no such directory\n",
    )
    assert up(capsys, "--model-path", str(path)) == (
        2,
        "llmmesh up: --model-path is served by vLLM pods: add --engine vllm\n",
    )
    assert up(capsys, "--model-name", "x") == (
        2,
        "llmmesh up: --model-name names the --model-path model: give --model-path too\n",
    )


def test_a_chat_model_is_served_under_its_name_within_its_window(tmp_path: Path) -> None:
    path = model_dir(tmp_path, "config.json", "tokenizer.json", "chat_template.jinja", positions=2048)
    model = served_model(path)
    assert (model.name, model.path, model.context_window) == ("my-chat", path, 2048)
    assert model.pod_env() == {
        "LLMMESH_MODEL": "my-chat",
        "LLMMESH_MODEL_PATH": str(path),
        "LLMMESH_CONTEXT_WINDOW": "2048",
    }
    assert model.global_env() == {
        "LLMMESH_DEFAULT_MODEL": "my-chat",
        "LLMMESH_DEFAULT_MODEL_CONTEXT_WINDOW": "2048",
    }
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    renamed = served_model(path, "house-model")
    assert (renamed.name, renamed.context_window) == ("house-model", 4096)
