"""``llmmesh up --engine vllm --model-path DIR``: the whole path (edge →
region → vLLM pod) serving a local Hugging Face chat model directory under
the name given, driven by the openai SDK."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import start_up, stop_up

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_up_with_vllm_serves_a_model_directory_through_the_whole_path(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    flags = ["--engine", "vllm", "--model-path", str(tiny_model_dir), "--model-name", "house-chat"]
    mesh = start_up(tmp_path, *flags, "--edge-port", "0", "--dev-key", "sk-llmmesh-vllm")
    try:
        assert mesh.info["engine_backend"] == "vllm"
        assert not (tmp_path / "models").exists()  # served from the directory given, nothing built
        client = openai.OpenAI(base_url=f"{mesh.edge_url}/v1", api_key=mesh.api_key, max_retries=0)
        assert [m.id for m in client.models.list().data if not m.id.endswith("-embed")] == ["house-chat"]
        stream = client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "say something about the ocean"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, models = "", None, set()
        for chunk in stream:
            models.add(chunk.model)
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None and 0 < usage.completion_tokens <= 12
        assert text and models == {"house-chat"}
        named = client.chat.completions.create(
            model="house-chat", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert named.model == "house-chat" and named.usage is not None and named.usage.completion_tokens > 0
    finally:
        status, out = stop_up(mesh)
    assert status == 0, out
