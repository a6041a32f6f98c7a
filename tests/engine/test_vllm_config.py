"""The one vLLM engine config: GPU settings, KV-cache dtype and offload,
speculative decoding and the disaggregated-prefill connector, rendered for
CPU and for GPUs, and what a device cannot run refused by setting name.
No engine starts here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmmesh.core.errors import InvalidArgument
from llmmesh.engine.backend import ResponseFormatSpec, ResponseFormatType, SamplingOptions
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.vllm_engine import features
from llmmesh.engine.vllm_engine.config import VllmEngineConfig
from llmmesh.engine.vllm_engine.features import UnsupportedFeature

MODEL = Path("/models/tiny")


def config(device: str = "cpu", **fields: Any) -> VllmEngineConfig:
    return VllmEngineConfig.from_settings(EngineSettings(backend="vllm", **fields), MODEL, device)


def test_gpu_settings_reach_vllm_by_its_own_names() -> None:
    kwargs = config(
        "cuda",
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.85,
        max_model_len=32768,
        kv_cache_dtype="fp8",
        kv_offloading_gib=16.0,
        cpu_offload_gib=2.0,
    ).engine_kwargs()
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["pipeline_parallel_size"] == 2
    assert kwargs["gpu_memory_utilization"] == 0.85
    assert kwargs["max_model_len"] == 32768
    assert kwargs["kv_cache_dtype"] == "fp8"
    assert kwargs["kv_offloading_size"] == 16.0
    assert kwargs["cpu_offload_gb"] == 2.0


def test_max_model_len_and_context_window_are_one_limit() -> None:
    assert EngineSettings(max_model_len=32768).context_window == 32768
    assert EngineSettings(context_window=8192).context_window == 8192
    assert EngineSettings(context_window=8192, max_model_len=8192).context_window == 8192
    with pytest.raises(ValueError, match="one limit"):
        EngineSettings(context_window=8192, max_model_len=16384)


def test_speculative_decoding_is_vllms_speculative_config_for_the_pod_and_the_peer() -> None:
    ngram = config(
        speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=5, prompt_lookup_min=1
    )
    expected = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 5,
        "prompt_lookup_min": 1,
    }
    assert ngram.speculating
    assert ngram.engine_kwargs()["speculative_config"] == expected
    arguments = ngram.serve_arguments()
    assert json.loads(arguments[arguments.index("--speculative-config") + 1]) == expected
    draft = config(speculative_method="draft_model", speculative_model="/models/draft")
    assert draft.engine_kwargs()["speculative_config"] == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": "/models/draft",
    }
    plain = config()
    assert not plain.speculating and "speculative_config" not in plain.engine_kwargs()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"speculative_method": "eagle"}, "speculative_method must be one of"),
        ({"speculative_method": "draft_model"}, "needs speculative_model"),
        ({"speculative_model": "/models/draft"}, "only with speculative_method draft_model"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 4}, "prompt_lookup_min"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kv_offloading_gib": -1.0}, "kv_offloading_gib"),
        ({"vllm_device": "tpu"}, "vllm_device"),
        ({"pod_role": "router"}, "pod_role"),
    ],
)
def test_impossible_feature_settings_fail_at_start(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSettings(**fields)


@pytest.mark.parametrize(
    ("fields", "setting"),
    [
        ({"kv_offloading_gib": 4.0}, "kv_offloading_gib"),
        ({"cpu_offload_gib": 1.0}, "cpu_offload_gib"),
        ({"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype"),
        ({"kv_connector": "NixlConnector", "pod_role": "prefill"}, "kv_connector"),
    ],
)
def test_what_vllm_cannot_run_on_cpu_is_refused_by_setting(fields: dict[str, Any], setting: str) -> None:
    with pytest.raises(UnsupportedFeature) as refused:
        config("cpu", **fields)
    assert refused.value.setting == setting


def test_fp8_kv_cache_is_allowed_on_cpu() -> None:
    assert config("cpu", kv_cache_dtype="fp8").engine_kwargs()["kv_cache_dtype"] == "fp8"


# Importing vLLM warns about torch's own deprecations.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_the_disaggregation_connector_is_written_for_gpus_and_checked_by_vllm(
    role: str, kv_role: str
) -> None:
    pytest.importorskip("vllm")
    rendered = config("cuda", kv_connector="NixlConnector", pod_role=role)
    assert rendered.engine_kwargs()["kv_transfer_config"] == {
        "kv_connector": "NixlConnector",
        "kv_role": kv_role,
        "kv_buffer_device": "cuda",
    }
    arguments = rendered.serve_arguments()
    assert json.loads(arguments[arguments.index("--kv-transfer-config") + 1])["kv_role"] == kv_role
    with pytest.raises(UnsupportedFeature, match="no connector 'P2pNcclConnectr'"):
        config("cuda", kv_connector="P2pNcclConnectr", pod_role=role)


def test_a_speculating_pod_refuses_what_needs_logits_processing_by_name() -> None:
    with pytest.raises(InvalidArgument) as refused:
        features.refuse_when_speculating(SamplingOptions(logit_bias=((3, 1.0),)), None, resumed=False)
    assert refused.value.metadata["param"] == "logit_bias"
    guided = SamplingOptions(response_format=ResponseFormatSpec(type=ResponseFormatType.JSON_OBJECT))
    with pytest.raises(InvalidArgument, match="continuing a guided reply") as refused:
        features.refuse_when_speculating(guided, "response_format", resumed=True)
    assert refused.value.metadata["param"] == "response_format"
    features.refuse_when_speculating(SamplingOptions(max_tokens=8), None, resumed=False)
