"""How long the simulated engine takes per step (llm-d-inference-sim's model).

A step that admits sequences pays, per admitted sequence, a fixed prefill
overhead plus a cost per uncached prompt token, so prefix-cache hits shorten
time to first token. Every step also decodes one token for each running
sequence; its time grows with the batch: ``ITL * (1 + load_factor * running /
max_num_seqs)``. The scheduler sleeps the computed time and adds it to its
simulated clock, which tests read instead of wall-clock time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SimTimingModel:
    """Step costs of the simulator, in seconds."""

    prefill_overhead_s: float
    prefill_per_token_s: float
    inter_token_s: float
    batch_load_factor: float
    max_num_seqs: int

    def prefill_s(self, uncached_tokens: int) -> float:
        """Prefill cost of one sequence with ``uncached_tokens`` to compute."""
        return self.prefill_overhead_s + self.prefill_per_token_s * uncached_tokens

    def decode_step_s(self, running: int) -> float:
        """Time of one decode step with ``running`` sequences batched."""
        return self.inter_token_s * (1 + self.batch_load_factor * running / self.max_num_seqs)

    def step_s(self, running: int, admitted_uncached_tokens: Iterable[int]) -> float:
        """Time of one engine step: prefills of admitted sequences plus decode."""
        return self.decode_step_s(running) + sum(self.prefill_s(n) for n in admitted_uncached_tokens)
