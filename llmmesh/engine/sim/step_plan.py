"""What one simulated engine step computes (vLLM's ``SchedulerOutput``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmmesh.engine.sim.sequence import SimSequence


@dataclass
class StepPlan:
    """Tokens each scheduled sequence computes in the step, in batch order,
    and what the step cost. ``budget_left`` starts at the token budget."""

    budget_left: int
    tokens: dict[SimSequence, int] = field(default_factory=dict)
    preemptions: int = 0
    duration_s: float = 0.0

    @property
    def prefill_tokens(self) -> int:
        """Tokens of the step's prefill chunks (everything but the decodes)."""
        return sum(n for sequence, n in self.tokens.items() if not sequence.decoding)

    def schedule(self, sequence: SimSequence, num_tokens: int) -> None:
        self.tokens[sequence] = num_tokens
        self.budget_left -= num_tokens

    def drop(self, sequence: SimSequence) -> None:
        """Unschedule a sequence preempted later in the same step, refunding
        its tokens to the budget."""
        self.budget_left += self.tokens.pop(sequence, 0)
