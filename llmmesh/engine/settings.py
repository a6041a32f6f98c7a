"""Settings of one engine pod (``llmmesh engine``).

Where the defaults come from:

- ``block_size=16``, ``max_num_seqs``-style admission and the paged KV pool
  mirror vLLM's own defaults for GPUs (block size 16) and llm-d-inference-sim's
  knobs (``block-size``, ``kv-cache-size``, ``max-num-seqs``). We raise
  ``max_num_seqs`` to 32 and ``kv_blocks`` to 2048 (32 768 tokens, eight full
  context windows) so a laptop mesh is not capacity-bound by default.
- ``context_window=4096`` matches the small Llama-architecture model the
  project builds for vLLM-CPU.

The simulator (``sim_*``; :mod:`engine.sim.scheduler` describes the model):

- ``max_num_batched_tokens=2048`` (both backends): vLLM v1's token budget per step, its
  ``max_num_batched_tokens`` default for the OpenAI-compatible server on GPUs
  under 70 GiB and on A100s (8192 on H100-class GPUs). As in vLLM it must be
  at least ``max_num_seqs``, so every decode fits in a step.
- The timing model has the knobs of llm-d-inference-sim (``prefill-overhead``,
  ``prefill-time-per-token``, ``inter-token-latency``,
  ``time-factor-under-load``) arranged as BLIS's step model: a step costs the
  decode time of its batch, plus a fixed overhead and a per-token cost when it
  prefills. The numbers are our own vLLM-CPU measurements: vLLM 0.32 serving
  ``llmmesh-tiny`` on two cores, fitted by ``scripts/calibrate_sim.py``
  (time to first token of uncached prompts of 64 to 1024 tokens, and the
  inter-token latency of one generation and of a full batch of 32), rounded:
  ``sim_prefill_per_token_s=0.00012`` per computed prompt token (about
  8 000 tokens/s; prefix-cache hits cost nothing), ``sim_prefill_overhead_s=
  0.002`` per prefilling step (the fit's intercept less one decode step),
  ``sim_inter_token_s=0.005`` for a decode step and
  ``sim_batch_load_factor=1.1``, a full batch's step 2.1 times one
  generation's (the fit gave 0.9 to 1.3 over four runs). Beyond 1024 tokens
  the real prefill grows faster than linearly (attention), which the model
  leaves out.
- The ``sim_*`` fault settings (all off by default) inject the failures a
  failover drill needs: a generation failing mid-stream, a wedged GPU and a
  crashed pod. :mod:`engine.sim.faults` documents exactly what each models.
- Still simplified in the simulator (the full list is in
  :mod:`engine.sim.scheduler`): no CUDA graphs or batch padding, step time
  independent of context length, no speculative decoding, priority
  scheduling only, and block hashes that are its own chained SHA-256.

The vLLM engine's features (speculative decoding, KV-cache dtype and
offload, GPU parallelism) carry vLLM's own names, so a deployment (Helm,
the image) sets ``LLMMESH_TENSOR_PARALLEL_SIZE`` and reads it as vLLM's
``tensor_parallel_size``. Defaults are vLLM's (one GPU, 0.9 of its memory,
KV cache in the model's dtype, no speculation, no offload).
:mod:`engine.vllm_engine.features` checks them against the target device
and refuses what vLLM cannot do there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmmesh.core.config import setting
from llmmesh.core.mtls import MeshTlsSettings
from llmmesh.engine.embedding import EmbeddingSettings

SUPPORTED_BACKENDS = ("sim", "vllm")
SPECULATIVE_METHODS = ("", "ngram", "draft_model")
VLLM_DEVICES = ("auto", "cpu", "cuda")
POD_ROLES = ("both", "prefill", "decode")
DEFAULT_CONTEXT_WINDOW = 4096
# Embedding settings a pod without an embedding runner may carry: its choice of
# none, and the model files' place (the Dockerfile sets it for every pod).
_EMBEDDING_PLACES = ("embedding_backend", "embedding_model_path")


@dataclass(frozen=True)
class EngineSettings(EmbeddingSettings, MeshTlsSettings):
    """Everything an engine pod process needs; see the module docstring."""

    host: str = setting("127.0.0.1", "interface the gRPC server binds")
    port: int = setting(0, "port the gRPC server binds; 0 picks a free one")
    advertise_address: str = setting(
        "", "host:port its region dials; empty: the bound host:port (a 0.0.0.0 bind needs one)"
    )
    pod_id: str = setting("pod-0", "stable name of this pod, reported in every event")
    backend: str = setting("sim", "engine backend: 'sim' (simulator) or 'vllm' (vLLM's AsyncLLM)")
    model: str = setting("llmmesh-tiny", "name of the model this pod serves")
    context_window: int = setting(DEFAULT_CONTEXT_WINDOW, "most tokens in prompt plus output")
    block_size: int = setting(16, "tokens per KV-cache block")
    max_num_seqs: int = setting(32, "most generations batched at once")
    kv_blocks: int = setting(2048, "KV-cache blocks in the pool")
    ready_file: str = setting("", "write a JSON ready file here once serving; empty for none")
    load_interval_ms: int = setting(500, "default interval of WatchLoad reports, milliseconds")
    kv_event_retention: int = setting(10000, "KV-cache events kept for replay to reconnecting routers")
    metrics_port: int = setting(0, "port of the HTTP /metrics endpoint (vLLM's metric names); 0 picks one")
    model_path: str = setting(
        "",
        "Hugging Face model directory: vllm serves it (empty builds llmmesh-tiny in $LLMMESH_HOME/models); "
        "sim tokenizes prompts with its tokenizer (empty: the simulator's word pieces)",
    )
    vllm_kv_cache_gib: int = setting(1, "vllm backend on CPU: KV-cache memory in whole GiB")
    vllm_dtype: str = setting(
        "float32", "vllm backend: weight and activation dtype (auto, float32, bfloat16)"
    )
    max_num_batched_tokens: int = setting(
        2048, "most tokens one engine step computes, decodes and prefill chunks (vLLM's budget)"
    )
    max_model_len: int = setting(
        0, "vLLM's name for context_window; when set it is the pod's context window (0: context_window)"
    )
    vllm_device: str = setting(
        "auto", "vllm backend: device the engine config is for: cpu, cuda, or auto (vLLM's platform)"
    )
    tensor_parallel_size: int = setting(1, "vllm backend: GPUs each layer is split across")
    pipeline_parallel_size: int = setting(1, "vllm backend: pipeline stages (groups of layers) across GPUs")
    gpu_memory_utilization: float = setting(
        0.9, "vllm backend: share of GPU memory vLLM may use (on CPU vllm_kv_cache_gib sizes the cache)"
    )
    kv_cache_dtype: str = setting(
        "auto", "vllm backend: KV-cache dtype: auto (the model's), fp8, fp8_e4m3, fp8_e5m2"
    )
    kv_offloading_gib: float = setting(
        0.0, "vllm backend on GPUs: CPU memory for offloaded KV blocks, GiB; 0 off"
    )
    cpu_offload_gib: float = setting(
        0.0, "vllm backend on GPUs: model weights kept in CPU memory, GiB; 0 off"
    )
    speculative_method: str = setting(
        "", "vllm backend: speculative decoding: '' off, 'ngram' (prompt lookup) or 'draft_model'"
    )
    num_speculative_tokens: int = setting(4, "vllm backend: tokens proposed per step when speculating")
    prompt_lookup_max: int = setting(
        4, "vllm backend, ngram speculation: longest n-gram looked up in the prompt"
    )
    prompt_lookup_min: int = setting(2, "vllm backend, ngram speculation: shortest n-gram looked up")
    speculative_model: str = setting(
        "", "vllm backend, draft_model speculation: the draft model's directory (same tokenizer)"
    )
    pod_role: str = setting(
        "both", "disaggregated serving: 'prefill' (prompts only), 'decode' (generation only) or 'both'"
    )
    kv_connector: str = setting(
        "", "vllm backend on GPUs: vLLM KV connector moving KV blocks between prefill and decode pods"
    )
    sim_prefill_overhead_s: float = setting(0.002, "simulator: fixed cost of a step that prefills, seconds")
    sim_prefill_per_token_s: float = setting(0.00012, "simulator: cost of each prompt token computed, s")
    sim_inter_token_s: float = setting(0.005, "simulator: decode step time with an empty batch, seconds")
    sim_batch_load_factor: float = setting(1.1, "simulator: step slowdown at a full batch (1.0 doubles it)")
    sim_kv_transfer_overhead_s: float = setting(
        0.001, "simulator, disaggregated serving: fixed cost of taking a prompt's KV cache, seconds"
    )
    sim_kv_transfer_per_block_s: float = setting(
        0.0001, "simulator, disaggregated serving: cost of each KV block transferred, seconds"
    )
    sim_error_rate: float = setting(
        0.0,
        "simulator fault: share of generations that fail mid-stream with UNAVAILABLE "
        "(ENGINE_FAILED), chosen deterministically from the prompt and seed; 0 for none",
    )
    sim_stall_after_tokens: int = setting(
        0, "simulator fault: every generation stops producing tokens after this many, stream open; 0 off"
    )
    sim_crash_after_generations: int = setting(
        0, "simulator fault: the pod process exits with code 70, no drain, when this many generations start"
    )

    def __post_init__(self) -> None:
        if self.max_model_len < 0:
            raise ValueError("max_model_len must not be negative (0 takes context_window)")
        if self.max_model_len:
            if self.context_window not in (self.max_model_len, DEFAULT_CONTEXT_WINDOW):
                raise ValueError(
                    f"max_model_len ({self.max_model_len}) and context_window ({self.context_window}) "
                    "name one limit: set one of them"
                )
            # context_window is what the pod reads: vLLM's name sets it.
            object.__setattr__(self, "context_window", self.max_model_len)
        if self.backend not in SUPPORTED_BACKENDS:
            raise ValueError(f"backend must be one of {SUPPORTED_BACKENDS}, got {self.backend!r}")
        for name in (
            "context_window",
            "block_size",
            "max_num_seqs",
            "kv_blocks",
            "load_interval_ms",
            "kv_event_retention",
            "max_num_batched_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: a full batch of decodes must fit in one step.
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        self._check_embedding_settings()
        if self.vllm_kv_cache_gib <= 0:
            raise ValueError("vllm_kv_cache_gib must be positive")
        for name in (
            "sim_prefill_overhead_s",
            "sim_prefill_per_token_s",
            "sim_inter_token_s",
            "sim_batch_load_factor",
            "sim_kv_transfer_overhead_s",
            "sim_kv_transfer_per_block_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        # Written so that NaN fails too.
        if not 0.0 <= self.sim_error_rate <= 1.0:
            raise ValueError(f"sim_error_rate must be between 0 and 1, got {self.sim_error_rate}")
        for name in ("sim_stall_after_tokens", "sim_crash_after_generations"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative (0 turns the fault off)")
        self._check_vllm_features()

    def _check_embedding_settings(self) -> None:
        """An unknown embedding runner fails at start, and so does an
        ``embedding_*`` setting given to a pod that runs no embedding model
        (it would be ignored). Not ``embedding_model_path``: where the
        model's files lie, which an image sets for every pod it runs."""
        if self.embedding_runner(self.backend) != "none":
            return
        for field in dataclasses.fields(EmbeddingSettings):
            if field.name in _EMBEDDING_PLACES:
                continue
            if getattr(self, field.name) != field.default:
                raise ValueError(
                    f"{field.name} (LLMMESH_{field.name.upper()}) is set, but this {self.backend} pod "
                    "runs no embedding model (embedding_backend is 'none'): unset it, or set "
                    "embedding_backend to 'sim' or 'vllm'"
                )

    def _check_vllm_features(self) -> None:
        """The vLLM feature settings that are wrong on any device; what a
        device cannot do is :mod:`engine.vllm_engine.features`' to refuse."""
        if self.vllm_device not in VLLM_DEVICES:
            raise ValueError(f"vllm_device must be one of {VLLM_DEVICES}, got {self.vllm_device!r}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("kv_offloading_gib", "cpu_offload_gib"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must not be negative (0 turns it off)")
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {SPECULATIVE_METHODS}, got {self.speculative_method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.speculative_method == "draft_model" and not self.speculative_model:
            raise ValueError("speculative_method draft_model needs speculative_model (the draft's directory)")
        if self.pod_role not in POD_ROLES:
            raise ValueError(f"pod_role must be one of {POD_ROLES}, got {self.pod_role!r}")
        if self.speculative_model and self.speculative_method != "draft_model":
            raise ValueError("speculative_model is used only with speculative_method draft_model")
