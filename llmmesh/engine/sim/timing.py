"""How long one simulated engine step takes: BLIS's step model with
llm-d-inference-sim's knobs.

A step computes a batch of sequences: one token for each decoding sequence
and a chunk of prompt for each prefilling one (:mod:`engine.sim.scheduler`).
It costs

    decode_step_s(sequences in the step)
    + prefill_overhead_s                       if the step prefills anything
    + prefill_per_token_s * prompt tokens computed in the step

where ``decode_step_s(n) = inter_token_s * (1 + batch_load_factor * n /
max_num_seqs)``, so a full batch is slower per step, as on real hardware.
Prefix-cache hits are never computed, so they shorten time to first token.
The scheduler sleeps the computed time and adds it to its simulated clock,
which tests and metrics read instead of the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimTimingModel:
    """Step costs of the simulator, in seconds; a pure function of the step."""

    prefill_overhead_s: float
    prefill_per_token_s: float
    inter_token_s: float
    batch_load_factor: float
    max_num_seqs: int

    def prefill_s(self, prefill_tokens: int) -> float:
        """The prefill part of a step that computes ``prefill_tokens`` prompt
        tokens (over all its prefilling sequences); 0 when it computes none."""
        if prefill_tokens == 0:
            return 0.0
        return self.prefill_overhead_s + self.prefill_per_token_s * prefill_tokens

    def decode_step_s(self, num_seqs: int) -> float:
        """The part of a step that every step pays, for ``num_seqs`` sequences
        in the batch (decoding or prefilling)."""
        return self.inter_token_s * (1 + self.batch_load_factor * num_seqs / self.max_num_seqs)

    def step_s(self, num_seqs: int, prefill_tokens: int) -> float:
        """Time of one engine step with ``num_seqs`` sequences that computes
        ``prefill_tokens`` prompt tokens besides the decodes."""
        return self.decode_step_s(num_seqs) + self.prefill_s(prefill_tokens)
