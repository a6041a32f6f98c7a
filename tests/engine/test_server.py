"""Settings, backend choice and the ``serve`` lifecycle of an engine pod."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest

from engine.server import BackendNotAvailable, create_backend, serve
from engine.settings import EngineSettings
from llmmesh.config import add_arguments, load
from llmmesh.grpcserver import open_channel
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


def test_the_vllm_backend_says_it_is_not_available_yet() -> None:
    with pytest.raises(BackendNotAvailable, match="not installed or implemented yet"):
        create_backend(EngineSettings(backend="vllm"))


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
        "pod_id": "pod-9",
        "backend": "sim",
        "model": "llmmesh-tiny",
    }
    async with open_channel(payload["address"]) as channel:
        stub: pb_grpc.EngineServiceAsyncStub = pb_grpc.EngineServiceStub(channel)  # type: ignore[assignment]
        info = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
        assert info.pod_id == "pod-9"
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, timeout=10)
