"""``llmmesh up --engine vllm``: the whole path (edge → region → vLLM pod)
with the tiny model the pod builds on first use, driven by the openai SDK."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import start_up, stop_up

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_up_with_vllm_streams_through_the_whole_path(tmp_path: Path) -> None:
    mesh = start_up(tmp_path, "--engine", "vllm", "--edge-port", "0", "--dev-key", "sk-llmmesh-vllm")
    try:
        assert mesh.info["engine_backend"] == "vllm"
        # The pod built the model under the mesh home.
        marker = json.loads((tmp_path / "models" / "llmmesh-tiny" / "llmmesh-tiny.json").read_text())
        assert marker["name"] == "llmmesh-tiny"
        client = openai.OpenAI(base_url=f"{mesh.edge_url}/v1", api_key=mesh.api_key, max_retries=0)
        stream = client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "say something about the ocean"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = ""
        usage = None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None and 0 < usage.completion_tokens <= 12
        assert text
    finally:
        status, out = stop_up(mesh)
    assert status == 0, out
