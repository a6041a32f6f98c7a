"""The seeded chat workload: one shared system prompt and a distinct user
message per request.

The words come from the simulator's vocabulary, which is also the corpus the
tiny model's tokenizer was trained on, so with that model a word is one
token or a little more (capitals and punctuation split): the default system
prompt is about 300 tokens, longer than two 128-token KV blocks (vLLM's
block size on CPU), so prefix caching matters, and each user message of 30
to 60 words adds about 35 to 75 more.

Everything is a pure function of the seed, the phase name and the request's
index: every system and every run sees the same prompts in the same order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from llmmesh.engine.sim.vocabulary import WORDS

DEFAULT_SEED = 20261121
SYSTEM_PREAMBLE = "You are a careful assistant. Answer the user with plain words."


@dataclass(frozen=True)
class ChatRequest:
    """One request of the workload: a system and a user message, and how
    many tokens to generate (always all of them: the benchmark sets
    ``ignore_eos``)."""

    request_id: str
    system: str
    user: str
    max_tokens: int


@dataclass(frozen=True)
class ChatWorkload:
    """A deterministic chat workload; see the module docstring.

    ``system_words`` is the length of the shared system prompt after its
    preamble; ``user_words`` the inclusive range of a user message's length.
    """

    seed: int = DEFAULT_SEED
    system_words: int = 230
    user_words: tuple[int, int] = (30, 60)
    vocabulary: Sequence[str] = WORDS

    def __post_init__(self) -> None:
        low, high = self.user_words
        if not 1 <= low <= high:
            raise ValueError(f"user_words must be a range of positive lengths, got {self.user_words}")
        if self.system_words < 1 or not self.vocabulary:
            raise ValueError("system_words and the vocabulary must not be empty")

    @cached_property
    def system_prompt(self) -> str:
        """The system prompt every request shares."""
        rng = random.Random(f"{self.seed}/system")
        return f"{SYSTEM_PREAMBLE} {self._sentences(rng, self.system_words)}"

    def requests(self, phase: str, count: int, max_tokens: int) -> list[ChatRequest]:
        """``count`` requests for ``phase`` (e.g. ``"c8"`` or ``"warmup"``),
        ids ``{phase}-{index}``. Different phases get different user messages,
        so no phase finds another's prompts in the prefix cache beyond the
        shared system prompt."""
        if count < 0 or max_tokens < 1:
            raise ValueError("count must not be negative and max_tokens must be positive")
        return [
            ChatRequest(
                request_id=f"{phase}-{index}",
                system=self.system_prompt,
                user=self._user_message(phase, index),
                max_tokens=max_tokens,
            )
            for index in range(count)
        ]

    def _user_message(self, phase: str, index: int) -> str:
        # String seeds are hashed with SHA-512, not hash(): stable across
        # processes whatever PYTHONHASHSEED is.
        rng = random.Random(f"{self.seed}/{phase}/{index}")
        return self._sentences(rng, rng.randint(*self.user_words))

    def _sentences(self, rng: random.Random, words: int) -> str:
        return sentences(rng, self.vocabulary, words)


def sentences(rng: random.Random, vocabulary: Sequence[str], words: int) -> str:
    """Exactly ``words`` words of ``vocabulary`` in capitalised sentences of 5 to 14 words."""
    parts: list[str] = []
    left = words
    while left > 0:
        length = min(left, rng.randint(5, 14))
        chosen = [rng.choice(vocabulary) for _ in range(length)]
        chosen[0] = chosen[0].capitalize()
        parts.append(" ".join(chosen) + rng.choice(".?."))
        left -= length
    return " ".join(parts)
