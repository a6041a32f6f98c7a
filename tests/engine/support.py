"""Shared pieces of the engine tests: simulator settings and a collector of
generation events."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.backend import (
    GeneratedTokens,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
)
from engine.settings import EngineSettings
from engine.sim.backend import SimBackend

# Steps take well under a millisecond, so a whole reply takes a few ms.
FAST = EngineSettings(
    context_window=512,
    block_size=4,
    max_num_seqs=4,
    kv_blocks=256,
    sim_prefill_overhead_s=0.0001,
    sim_prefill_per_token_s=0.000001,
    sim_inter_token_s=0.0002,
    sim_batch_load_factor=1.0,
)
# Slow enough that a test acts while a generation is still running: the
# shortest reply (12 tokens) takes at least 0.6 s.
SLOW = dataclasses.replace(FAST, sim_inter_token_s=0.05)


@dataclass
class Generation:
    """Everything one generation streamed."""

    started: GenerationStarted | None = None
    deltas: list[GeneratedTokens] = field(default_factory=list)
    finished: GenerationFinished | None = None

    @property
    def token_ids(self) -> list[int]:
        return [token for delta in self.deltas for token in delta.token_ids]

    @property
    def text(self) -> str:
        return "".join(delta.text for delta in self.deltas)


async def collect(backend: SimBackend, request: GenerationRequest) -> Generation:
    """Run a generation to its end and keep every event."""
    generation = Generation()
    async for event in backend.generate(request):
        if isinstance(event, GenerationStarted):
            generation.started = event
        elif isinstance(event, GeneratedTokens):
            generation.deltas.append(event)
        else:
            generation.finished = event
    return generation
