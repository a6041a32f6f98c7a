"""The model family: sizes that differ, one tokenizer, per-size simulator costs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from llmmesh.core.model_family import FAMILY, LARGE, SMALL, TINY, family_model
from llmmesh.engine.tiny_model import TinyModelSpec, build_tokenizer, family_spec


def test_members_grow_in_parameters_and_simulated_cost() -> None:
    sizes = [TINY, SMALL, LARGE]
    params = [m.parameters for m in sizes]
    assert params == sorted(params) and len(set(params)) == 3
    decode = [m.sim_timing()["sim_inter_token_s"] for m in sizes]
    prefill = [m.sim_timing()["sim_prefill_per_token_s"] for m in sizes]
    assert decode == sorted(decode) and prefill == sorted(prefill)
    # llmmesh-tiny keeps the calibrated engine defaults.
    assert TINY.sim_timing() == pytest.approx(
        {"sim_inter_token_s": 0.005, "sim_prefill_per_token_s": 0.00012}
    )


def test_an_unknown_member_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="llmmesh-large"):
        family_model("llmmesh-huge")


def test_every_member_shares_the_tokenizer() -> None:
    reference = build_tokenizer(TinyModelSpec()).to_str()  # type: ignore[attr-defined]
    for name in FAMILY:
        spec = family_spec(name)
        assert (spec.vocab_size, spec.corpus_sentences) == (TinyModelSpec().vocab_size, 4000)
    assert build_tokenizer(family_spec("llmmesh-large")).to_str() == reference  # type: ignore[attr-defined]


ENGINE_UID = 10001
"""The user the images run the engine as (Dockerfile: USER 10001:10001)."""


def test_model_build_writes_the_member(tmp_path: Path) -> None:
    # World-enterable up to the build's own folder, as the image's /opt is; the build runs under
    # the strictest umask a builder could have.
    parent = Path(tempfile.mkdtemp(prefix="llmmesh-model-"))
    parent.chmod(0o755)
    out = parent / "small"
    try:
        _build_and_check(out)
    finally:
        shutil.rmtree(parent)


def _build_and_check(out: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmmesh", "model", "build", "--name", "llmmesh-small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=lambda: os.umask(0o077),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["name"] == "llmmesh-small"
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (SMALL.num_layers, SMALL.hidden_size)
    assert json.loads((out / "llmmesh-tiny.json").read_text())["name"] == "llmmesh-small"
    # Readable by an engine that runs as another user (the image builds as root, runs as 10001).
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    assert modes["model.safetensors"] == 0o644, modes
    assert set(modes.values()) == {0o644}, modes
    assert out.stat().st_mode & 0o777 == 0o755
    if os.geteuid() != 0:
        return  # only root can run a process as the engine's user; the modes above are what it needs
    # The engine's user reads every byte of every file (the system Python: the venv may be root's own).
    read = "import pathlib, sys; print(sum(len(p.read_bytes()) for p in pathlib.Path(sys.argv[1]).iterdir()))"
    as_engine = ["setpriv", f"--reuid={ENGINE_UID}", f"--regid={ENGINE_UID}", "--clear-groups"]
    seen = subprocess.run(
        [*as_engine, "/usr/bin/python3", "-c", read, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert seen.returncode == 0, seen.stderr
    assert int(seen.stdout) == sum(p.stat().st_size for p in out.iterdir())


def test_model_build_refuses_a_name_outside_the_family(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmmesh", "model", "build", "--name", "gpt-9", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "llmmesh-small" in done.stderr
