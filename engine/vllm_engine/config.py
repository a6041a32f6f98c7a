"""One description of the vLLM engine a pod runs, used twice: as
``AsyncEngineArgs`` for our pod and as ``vllm serve`` flags for the peer that
``llmmesh bench engine`` measures, so both serve the same engine."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.settings import EngineSettings

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

    @classmethod
    def from_settings(cls, settings: EngineSettings, model_path: Path) -> VllmEngineConfig:
        return cls(
            model_path=model_path,
            served_model_name=settings.model,
            max_model_len=settings.context_window,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            kv_cache_gib=settings.vllm_kv_cache_gib,
            dtype=settings.vllm_dtype,
        )

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
        }

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
        return arguments
