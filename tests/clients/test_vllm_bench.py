"""``vllm bench serve`` unchanged against the edge, on the served model's
tokenizer (``llmmesh-tiny``'s): its default backend (``openai``, text
completions) and ``openai-chat`` (chat completions), each a small run of
random prompts. The benchmark counts a request as successful only when its
stream parses as vLLM's server would frame it; ``ignore_eos`` (which it
sends for random prompts) makes every reply exactly the output length."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from llmmesh.engine.tiny_model import MODEL_NAME
from tests.stack import DEV_KEY, Stack

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

PROMPTS = 8
OUTPUT_LEN = 16
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the first run writes the tokenizer; later runs read it."""
    return tmp_path_factory.mktemp("tokenizer")


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param([], id="openai-completions"),
        pytest.param(["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"], id="openai-chat"),
    ],
)
async def test_bench_serve_completes_every_request(
    shared_stack: Stack, tokenizer_dir: Path, tmp_path: Path, backend: list[str]
) -> None:
    assert shared_stack.edge is not None
    command = [
        sys.executable,
        "-m",
        "tests.clients.vllm_bench",
        "--base-url",
        shared_stack.edge.url,
        "--model",
        MODEL_NAME,
        "--tokenizer",
        str(tokenizer_dir),
        "--num-prompts",
        str(PROMPTS),
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        str(OUTPUT_LEN),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "result.json",
        *backend,
    ]
    env = {**os.environ, "OPENAI_API_KEY": DEV_KEY, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    bench = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(bench.communicate(), TIMEOUT_S)
    finally:
        if bench.returncode is None:
            bench.kill()
            await bench.wait()
    log = output.decode(errors="replace")
    assert bench.returncode == 0, log[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["completed"], result["failed"]) == (PROMPTS, 0), log[-4000:]
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN
