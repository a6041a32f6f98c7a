"""What ``llmmesh bench engine`` runs: levels, request counts, lengths.
Kept apart from the scenario so the command line can build one cheaply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineBenchPlan:
    """What to run. Each system serves ``rounds`` rounds per level of
    ``requests_per_level`` requests each (None means 4 x concurrency)."""

    concurrency: tuple[int, ...] = (8, 32)
    requests_per_level: int | None = None
    rounds: int = 4
    max_tokens: int = 128
    warmup_requests: int = 32
    model_path: str = ""
    # A vLLM-CPU engine's start (imports, weights, KV cache) can take minutes
    # on a busy two-core machine: a minute alone, more than five beside other work.
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    # A speculative decoding method (``ngram``): measure our pod with it
    # against our pod without it, instead of against ``vllm serve``.
    speculative: str = ""

    def __post_init__(self) -> None:
        if self.speculative not in ("", "ngram"):
            raise ValueError(f"speculative must be ngram (or empty), got {self.speculative!r}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency levels must be positive")
        if self.rounds < 1:
            raise ValueError("rounds must be positive")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ValueError("requests per level must be positive")
        if self.max_tokens < 1 or self.warmup_requests < 0:
            raise ValueError("max_tokens must be positive and warm-up requests not negative")

    def requests_at(self, concurrency: int) -> int:
        return self.requests_per_level or 4 * concurrency


ROUTING_POLICIES = ("precise", "approximate", "round_robin", "least_loaded")
PEER_POLICIES = ("cache_aware", "kv_aware")
ROUTING_BACKENDS = ("sim", "vllm")
# The routing workloads: multi-turn conversations over long shared system
# prompts, or unique long documents mixed with long chat replies
# (llmmesh.bench.routing_prefill_heavy), long-context RAG and agentic
# multi-turn tasks (llmmesh.bench.routing_seed_workloads); all but the
# first on the simulator only.
ROUTING_WORKLOADS = ("prefix-reuse", "prefill-heavy", "rag", "agentic")
# How the simulator's run keeps time: in virtual time, in one process
# (llmmesh.bench.routing_virtual), or end to end on the wall clock.
ROUTING_CLOCKS = ("virtual", "real")


@dataclass(frozen=True)
class RoutingBackendPlan:
    """One backend's part of ``llmmesh bench routing``: the pods, the users
    and the workload (lengths in words, about a token each).

    ``kv_blocks`` fixes each pod's KV cache in blocks; None sizes it so the
    workload's working set fills ``kv_pressure`` of the cluster's cache (the
    simulator; vLLM-CPU's cache is whole GiB, see the scenario). ``policies``
    are our region's; ``peer_policies`` vllm-router's (vLLM only)."""

    pods: int
    concurrency: int
    max_num_seqs: int
    tenants: int
    system_words: int
    conversations_per_tenant: int
    turns_per_conversation: int
    max_tokens: int
    policies: tuple[str, ...]
    peer_policies: tuple[str, ...] = ()
    warmup_per_tenant: int = 1
    ramp_s: float = 0.0
    kv_pressure: float = 0.7
    kv_blocks: int | None = None
    block_size: int = 16
    # Policies also run disaggregated (simulator only): the same pods, half
    # prefill and half decode, against the same policy on whole-turn pods.
    disaggregated: tuple[str, ...] = ()
    workload: str = "prefix-reuse"

    def __post_init__(self) -> None:
        for name in (
            "pods",
            "concurrency",
            "max_num_seqs",
            "tenants",
            "system_words",
            "conversations_per_tenant",
            "turns_per_conversation",
            "max_tokens",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.warmup_per_tenant < 0 or not self.ramp_s >= 0.0:
            raise ValueError("warm-up conversations and the ramp-up must not be negative")
        if not self.kv_pressure > 0.0 or (self.kv_blocks is not None and self.kv_blocks < 1):
            raise ValueError("kv_pressure and kv_blocks must be positive")
        if self.workload not in ROUTING_WORKLOADS:
            raise ValueError(f"workload must be one of {', '.join(ROUTING_WORKLOADS)}, got {self.workload!r}")
        if self.disaggregated and self.pods < 2:
            raise ValueError("disaggregated serving needs at least 2 pods (a prefill and a decode pod)")
        unknown = (set(self.policies) | set(self.disaggregated)) - set(ROUTING_POLICIES)
        unknown_peer = set(self.peer_policies) - set(PEER_POLICIES)
        if unknown or unknown_peer:
            raise ValueError(f"unknown routing policies: {', '.join(sorted(unknown | unknown_peer))}")


SIM_ROUTING = RoutingBackendPlan(
    pods=4,
    concurrency=16,
    max_num_seqs=8,
    tenants=8,
    system_words=2000,
    conversations_per_tenant=6,
    turns_per_conversation=3,
    max_tokens=32,
    policies=ROUTING_POLICIES,
    disaggregated=("precise",),
)
VLLM_ROUTING = RoutingBackendPlan(
    pods=2,
    concurrency=4,
    max_num_seqs=8,
    tenants=4,
    system_words=600,
    conversations_per_tenant=6,
    turns_per_conversation=3,
    max_tokens=32,
    policies=("precise",),
    peer_policies=PEER_POLICIES,
)


@dataclass(frozen=True)
class RoutingBenchPlan:
    """What ``llmmesh bench routing`` runs: a plan per backend, None for a
    backend left out. ``clock`` is how the simulator's part keeps time
    (vLLM runs in real time); a virtual run splits its pods over
    ``regions`` regions."""

    sim: RoutingBackendPlan | None = SIM_ROUTING
    vllm: RoutingBackendPlan | None = VLLM_ROUTING
    model_path: str = ""
    startup_timeout_s: float = 180.0
    request_timeout_s: float = 300.0
    clock: str = "virtual"
    regions: int = 1

    def __post_init__(self) -> None:
        if self.sim is None and self.vllm is None:
            raise ValueError("nothing to run: no backend")
        if self.clock not in ROUTING_CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(ROUTING_CLOCKS)}, got {self.clock!r}")
        if self.regions < 1 or (self.regions > 1 and self.clock != "virtual"):
            raise ValueError("several regions run in virtual time only (--clock virtual)")
        if self.sim is not None and self.sim.pods < self.regions:
            raise ValueError(f"{self.sim.pods} pods cannot be split over {self.regions} regions")
        if self.vllm is not None and self.vllm.workload != "prefix-reuse":
            raise ValueError(f"the {self.vllm.workload} workload runs on the simulator only (--backend sim)")
        if self.vllm is not None and self.vllm.disaggregated:
            raise ValueError(
                "disaggregated serving runs on the simulator only (vLLM pods take no P/D phases)"
            )
