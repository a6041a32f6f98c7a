"""The fleet benchmark's mixed workload, from a seed: chit-chat and
code or maths questions in a fixed share.

Chit-chat turns are a short greeting or small-talk question (a dozen to
thirty words) answered at length (``chat_max_tokens``), as in a consumer
chat service, where most turns are conversation and most tokens are
replies. Hard turns are a task asking for code or a proof, with a code
block or equations and a few hundred words of context, and a shorter
reply budget (``hard_max_tokens``). The same seed gives the same turns,
so every system of a run gets the very same requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from llmmesh.engine.sim.vocabulary import WORDS

CHAT = "chat"
HARD = "hard"

_GREETINGS = ("Hi", "Hello", "Hey there", "Good morning", "Good evening", "Hi again")
_SMALL_TALK = (
    "how are you doing today?",
    "what is a nice name for a cat?",
    "can you tell me something cheerful?",
    "what should I cook for dinner tonight?",
    "do you like rainy days?",
    "what is your favourite season and why do people love it?",
    "any tips for a relaxing weekend?",
    "tell me a short story about a friendly dog.",
    "what would be a fun hobby to pick up?",
    "can you suggest a good book for a long train ride?",
)
_TASKS = (
    "Implement a Python function that merges overlapping intervals and prove it runs in O(n log n).",
    "Write a SQL query and a Python script that find duplicate rows, then explain why the index helps.",
    "Solve the equation 3 * x ^ 2 + 2 * x - 5 = 0 and prove that both roots are real, step by step.",
    "Debug this JavaScript function that should return the derivative of a polynomial.",
    "Prove the theorem that the sum of the first n odd numbers is n ^ 2, then implement a check in Rust.",
    "Refactor this Python class and compute the probability that the cache misses twice in a row.",
)
_CODE = (
    "```python\ndef merge(intervals):\n    intervals.sort()\n    out = []\n"
    "    for start, end in intervals:\n        if out and start <= out[-1][1]:\n"
    "            out[-1][1] = max(out[-1][1], end)\n        else:\n            out.append([start, end])\n"
    "    return out\n```"
)


@dataclass(frozen=True)
class FleetTurn:
    """One request of the workload."""

    kind: str
    """``chat`` or ``hard``."""
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class FleetWorkload:
    """How the turns are drawn."""

    turns: int = 60
    chat_share: float = 0.7
    chat_max_tokens: int = 128
    hard_max_tokens: int = 128
    hard_context_words: int = 160
    seed: int = 20261124

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError("the workload needs at least one turn")
        if not 0.0 <= self.chat_share <= 1.0:
            raise ValueError(f"chat_share must be between 0 and 1, got {self.chat_share}")
        if min(self.chat_max_tokens, self.hard_max_tokens) < 1:
            raise ValueError("max tokens must be positive")

    def generate(self) -> list[FleetTurn]:
        """The turns, in the order every system sends them."""
        rng = random.Random(self.seed)
        turns = []
        for _ in range(self.turns):
            if rng.random() < self.chat_share:
                prompt = f"{rng.choice(_GREETINGS)}! {rng.choice(_SMALL_TALK)}"
                turns.append(FleetTurn(CHAT, prompt, self.chat_max_tokens))
            else:
                context = " ".join(rng.choice(WORDS) for _ in range(self.hard_context_words))
                prompt = f"{rng.choice(_TASKS)}\n{_CODE}\nContext: {context}."
                turns.append(FleetTurn(HARD, prompt, self.hard_max_tokens))
        return turns
