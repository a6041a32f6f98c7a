"""One description of the vLLM engine a pod runs, used twice: as
``AsyncEngineArgs`` for our pod and as ``vllm serve`` flags for the peer that
``llmmesh bench engine`` measures, so both serve the same engine."""

from __future__ import annotations

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
        """Keyword arguments of ``vllm.engine.arg_utils.AsyncEngineArgs``."""
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
        ]
        if self.enforce_eager:
            arguments.append("--enforce-eager")
        return arguments
