"""Shared pieces of the engine tests: simulator settings, a collector of
generation events and a simulator driven one step at a time."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from llmmesh.engine.backend import (
    GeneratedTokens,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
)
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.sampler import DeterministicSampler
from llmmesh.engine.sim.sequence import SimSequence
from llmmesh.engine.sim.step_plan import StepPlan

# Steps take well under a millisecond, so a whole reply takes a few ms.
FAST = EngineSettings(
    insecure=True,
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
    # Every event in order, to check that each kind came exactly once.
    events: list[GenerationEvent] = field(default_factory=list)

    def add(self, event: GenerationEvent) -> None:
        self.events.append(event)
        if isinstance(event, GenerationStarted):
            self.started = event
        elif isinstance(event, GeneratedTokens):
            self.deltas.append(event)
        else:
            self.finished = event

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
        generation.add(event)
    return generation


class SteppedSimulator:
    """The simulator's scheduler driven synchronously, one step per call and
    no event loop, so a test sees every step and its simulated time."""

    def __init__(self, settings: EngineSettings = FAST) -> None:
        self.settings = settings
        # Never started: only its pool, timing model and scheduler are used.
        self.backend = SimBackend(settings)
        self.scheduler = self.backend.scheduler
        self.pool = self.backend.pool
        self.timing = self.backend.timing
        self._sampler = DeterministicSampler(self.backend.tokenizer)
        self._arrivals = itertools.count()
        self.sequences: dict[str, SimSequence] = {}
        self.generations: dict[str, Generation] = {}
        # Requests aborted by the test; they leave at the start of the next step.
        self.aborted: set[str] = set()

    def submit(self, request: GenerationRequest) -> SimSequence:
        sequence = SimSequence(
            request,
            next(self._arrivals),
            sampler=self._sampler,
            tokenizer=self.backend.tokenizer,
            context_window=self.settings.context_window,
        )
        self.scheduler.submit(sequence)
        self.sequences[request.request_id] = sequence
        self.generations[request.request_id] = Generation()
        return sequence

    def step(self) -> StepPlan:
        """Plan and run one step (if it has work); collect what it streamed."""
        plan = self.scheduler.plan_step()
        if plan.tokens:
            self.scheduler.finish_step(plan)
        self._collect()
        return plan

    def run_until_idle(self, max_steps: int = 10_000) -> int:
        """Step until nothing is left to schedule; the number of steps."""
        for steps in range(max_steps):
            plan = self.step()
            if not plan.tokens and not plan.preemptions:
                return steps
        raise AssertionError(f"still busy after {max_steps} steps")

    def abort(self, request_id: str) -> bool:
        if not self.scheduler.abort(request_id):
            return False
        self.aborted.add(request_id)
        return True

    def _collect(self) -> None:
        for request_id, sequence in self.sequences.items():
            while not sequence.events.empty():
                event = sequence.events.get_nowait()
                assert not isinstance(event, Exception), event
                self.generations[request_id].add(event)
