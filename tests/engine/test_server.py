"""Settings, backend choice and the ``serve`` lifecycle of an engine pod."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

import pytest

from llmmesh.core.config import add_arguments, load
from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import BackendNotAvailable, create_backend, serve
from llmmesh.engine.settings import EngineSettings
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc
from tests.engine.support import FAST


def test_every_setting_has_a_flag_and_an_environment_variable() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, EngineSettings)
    args = parser.parse_args(["--pod-id", "pod-7", "--sim-inter-token-s", "0.001"])
    settings = load(EngineSettings, args, environ={"LLMMESH_KV_BLOCKS": "64", "LLMMESH_POD_ID": "ignored"})
    assert (settings.pod_id, settings.sim_inter_token_s, settings.kv_blocks) == ("pod-7", 0.001, 64)
    assert all(field.metadata.get("help") for field in dataclasses.fields(EngineSettings))


def test_the_vllm_backend_refuses_a_directory_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json is missing"):
        create_backend(EngineSettings(backend="vllm", model_path=str(tmp_path)))


def test_a_missing_vllm_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    # A None entry in sys.modules makes the import fail as if vLLM were absent.
    monkeypatch.setitem(sys.modules, "llmmesh.engine.vllm_engine.backend", None)
    with pytest.raises(BackendNotAvailable, match=re.escape("pip install -e '.[vllm]'")):
        create_backend(EngineSettings(backend="vllm", model_path=str(tmp_path)))


def test_unknown_backends_and_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        EngineSettings(backend="tgi")
    with pytest.raises(ValueError, match="block_size must be positive"):
        EngineSettings(block_size=0)


def test_default_timing_streams_a_short_reply_well_under_a_second() -> None:
    defaults = EngineSettings()
    reply_s = defaults.sim_prefill_overhead_s + 32 * defaults.sim_prefill_per_token_s
    reply_s += 16 * defaults.sim_inter_token_s * (1 + defaults.sim_batch_load_factor / defaults.max_num_seqs)
    assert reply_s < 0.5


@pytest.mark.asyncio
async def test_serve_writes_the_ready_file_and_drains_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "engine.json"
    task = asyncio.create_task(serve(dataclasses.replace(FAST, ready_file=str(ready), pod_id="pod-9")))
    for _ in range(1000):
        if ready.exists() or task.done():
            break
        await asyncio.sleep(0.005)
    payload = json.loads(ready.read_text())
    assert payload == {
        "address": payload["address"],
        "metrics_url": payload["metrics_url"],
        "pod_id": "pod-9",
        "backend": "sim",
        "model": "llmmesh-tiny",
    }
    async with open_channel(payload["address"]) as channel:
        stub: pb_grpc.EngineServiceAsyncStub = pb_grpc.EngineServiceStub(channel)  # type: ignore[assignment]
        info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert info.pod_id == "pod-9"
    metrics = await asyncio.to_thread(urllib.request.urlopen, payload["metrics_url"], timeout=10)
    assert "vllm:num_requests_running" in metrics.read().decode()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, timeout=10)
