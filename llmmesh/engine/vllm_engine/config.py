"""One description of the vLLM engine a pod runs, used twice: as
``AsyncEngineArgs`` for our pod and as ``vllm serve`` flags for the peer that
``llmmesh bench engine`` measures, so both serve the same engine.

It holds the GPU settings (tensor and pipeline parallelism, GPU memory
utilisation, KV-cache dtype and offload), speculative decoding and the
disaggregated-prefill connector too; :mod:`engine.vllm_engine.features`
checks them against the device before vLLM starts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmesh.engine.settings import EngineSettings

# A pod's role in disaggregated serving, in vLLM's KVTransferConfig terms:
# a prefill pod produces KV blocks, a decode pod consumes them.
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}

# vLLM hashes KV blocks with SHA-256 seeded from PYTHONHASHSEED when set:
# one value for every pod makes block hashes comparable across pods.
BLOCK_HASH_SEED = "0"


@dataclass(frozen=True)
class VllmEngineConfig:
    """The engine arguments that matter for serving, in vLLM's own terms."""

    model_path: Path
    served_model_name: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_gib: int
    dtype: str
    enable_prefix_caching: bool = True
    scheduling_policy: str = "priority"
    # CPU: no CUDA graphs to capture; eager mode starts in seconds.
    enforce_eager: bool = True
    # Guided decoding (tool choices, JSON response formats): xgrammar, vLLM's
    # first choice, without its fallback to another backend, so a schema
    # feature it lacks is refused (INVALID_ARGUMENT) instead of changing
    # backend per request. Compact JSON: a grammar that allows free
    # whitespace lets a weak model spend its whole token budget on blanks
    # between keys (the tiny model does), and compact JSON is still JSON.
    structured_outputs_backend: str = "xgrammar"
    compact_json: bool = True
    # "cpu" or "cuda": what the config is for (features.resolve_device).
    device: str = "cpu"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    kv_offloading_gib: float = 0.0
    cpu_offload_gib: float = 0.0
    # vLLM's speculative_config as a dict, None when not speculating.
    speculative: dict[str, Any] | None = None
    # vLLM's KVTransferConfig fields as a dict, None without a connector.
    kv_transfer: dict[str, Any] | None = None

    @classmethod
    def from_settings(
        cls, settings: EngineSettings, model_path: Path, device: str | None = None
    ) -> VllmEngineConfig:
        """The config ``settings`` describe, for ``device`` (``settings.
        vllm_device`` when None; ``auto`` is vLLM's platform). Raises
        :class:`~engine.vllm_engine.features.UnsupportedFeature` for a
        feature vLLM cannot run there."""
        from llmmesh.engine.vllm_engine import features

        target = features.resolve_device(device or settings.vllm_device)
        config = cls(
            model_path=model_path,
            served_model_name=settings.model,
            max_model_len=settings.context_window,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            kv_cache_gib=settings.vllm_kv_cache_gib,
            dtype=settings.vllm_dtype,
            device=target,
            tensor_parallel_size=settings.tensor_parallel_size,
            pipeline_parallel_size=settings.pipeline_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            kv_cache_dtype=settings.kv_cache_dtype,
            kv_offloading_gib=settings.kv_offloading_gib,
            cpu_offload_gib=settings.cpu_offload_gib,
            speculative=features.speculative_config(settings),
            kv_transfer=features.kv_transfer_config(settings, target),
        )
        features.check(config)
        return config

    @property
    def speculating(self) -> bool:
        """Whether the engine speculates (vLLM then takes no custom logits
        processor and no logit bias)."""
        return self.speculative is not None

    def environment(self) -> dict[str, str]:
        """Variables the engine process needs before vLLM is imported."""
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", BLOCK_HASH_SEED),
        }

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.engine.arg_utils.AsyncEngineArgs`` and
        ``vllm.LLM``; ``structured_outputs_config`` is a dict, which ``LLM``
        takes as is and ``AsyncEngineArgs`` as ``StructuredOutputsConfig(**it)``."""
        return {
            "model": str(self.model_path),
            "served_model_name": [self.served_model_name],
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "dtype": self.dtype,
            "enable_prefix_caching": self.enable_prefix_caching,
            "scheduling_policy": self.scheduling_policy,
            "enforce_eager": self.enforce_eager,
            "structured_outputs_config": self.structured_outputs_config(),
            **self._device_kwargs(),
        }

    def _device_kwargs(self) -> dict[str, Any]:
        """The GPU, KV-cache and speculation arguments; unset ones are left
        out, so vLLM's own defaults apply."""
        kwargs: dict[str, Any] = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
        if self.kv_offloading_gib:
            kwargs["kv_offloading_size"] = self.kv_offloading_gib
        if self.cpu_offload_gib:
            kwargs["cpu_offload_gb"] = self.cpu_offload_gib
        if self.speculative is not None:
            kwargs["speculative_config"] = dict(self.speculative)
        if self.kv_transfer is not None:
            kwargs["kv_transfer_config"] = dict(self.kv_transfer)
        return kwargs

    def structured_outputs_config(self) -> dict[str, Any]:
        """vLLM's ``StructuredOutputsConfig`` fields."""
        return {
            "backend": self.structured_outputs_backend,
            "disable_any_whitespace": self.compact_json,
        }

    def serve_arguments(self) -> list[str]:
        """The same engine as ``vllm serve`` command-line arguments."""
        arguments = [
            str(self.model_path),
            "--served-model-name",
            self.served_model_name,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--dtype",
            self.dtype,
            "--scheduling-policy",
            self.scheduling_policy,
            "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
            "--structured-outputs-config",
            json.dumps(self.structured_outputs_config()),
        ]
        if self.enforce_eager:
            arguments.append("--enforce-eager")
        for name, value in self._device_kwargs().items():
            flag = "--" + name.replace("_", "-")
            arguments += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
        return arguments
