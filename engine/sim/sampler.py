"""Deterministic output for the simulator.

The output token at position ``i`` is a pure function of (prompt token ids,
seed, ``i``): it never depends on earlier sampled tokens, nor on resumed
output tokens. So a generation resumed at offset ``k`` after a failover
produces exactly the tokens ``k, k+1, …`` the uninterrupted one would have,
which is what session rehydration needs a simulator to prove.

Greedy decoding (temperature 0 or unset) ignores the seed and draws from a
narrow pool of frequent words, as greedy output is repetitive; sampling with
a temperature uses the seed (or, without one, the prompt alone) and a pool
scaled by ``top_p``. Text reads as lower-case sentences: words with leading
spaces, the odd comma or full stop, a capital after a full stop, and a full
stop at the natural end of the reply.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from engine.backend import SamplingOptions
from engine.sim.tokenizer import SimTokenizer
from engine.sim.vocabulary import WORDS

MIN_REPLY_TOKENS = 12
MAX_REPLY_TOKENS = 80
NO_NATURAL_END = 2**62
GREEDY_POOL = 64
# Words that have a capitalized piece in the vocabulary.
_CAPITALIZED = 100
# Out of 256: a quarter of the eligible positions carry a mark, and about a
# third of the marks are full stops, the rest commas.
_MARK_THRESHOLD = 64
_PERIOD_THRESHOLD = 85


@dataclass(frozen=True)
class ReplyPlan:
    """What a prompt's reply will be, fixed before the first token."""

    digest: bytes
    natural_length: int
    pool_size: int


class DeterministicSampler:
    """Maps (prompt, sampling options, position) to a token id."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        self._word_ids = [tokenizer.piece_id(" " + word) for word in WORDS]
        self._capital_ids = [tokenizer.piece_id(" " + word.capitalize()) for word in WORDS[:_CAPITALIZED]]
        self._comma_id = tokenizer.piece_id(",")
        self._period_id = tokenizer.piece_id(".")

    def plan(self, prompt_token_ids: Sequence[int], sampling: SamplingOptions) -> ReplyPlan:
        """The reply plan of a prompt; resumed output tokens are not part of it."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(struct.pack(f"<{len(prompt_token_ids)}I", *prompt_token_ids))
        greedy = not sampling.temperature
        if not greedy and sampling.seed is not None:
            digest.update(b"seed" + sampling.seed.to_bytes(8, "little", signed=True))
        value = digest.digest()
        span = MAX_REPLY_TOKENS - MIN_REPLY_TOKENS + 1
        natural_length = MIN_REPLY_TOKENS + int.from_bytes(value[:4], "little") % span
        if sampling.ignore_eos:
            # No end-of-sequence: the reply runs to max_tokens or the window, as in vLLM.
            natural_length = NO_NATURAL_END
        if greedy:
            pool = GREEDY_POOL
        else:
            top_p = 1.0 if sampling.top_p is None else sampling.top_p
            pool = max(GREEDY_POOL // 4, round(len(self._word_ids) * top_p))
        return ReplyPlan(value, natural_length, pool)

    def _draw(self, plan: ReplyPlan, position: int) -> bytes:
        return hashlib.blake2b(plan.digest + position.to_bytes(8, "little"), digest_size=8).digest()

    def _is_period(self, plan: ReplyPlan, position: int) -> bool:
        if position == plan.natural_length - 1:
            return True
        # Marks only at every third position and never right before the final
        # stop, so two marks never touch.
        if position % 3 != 2 or position >= plan.natural_length - 2:
            return False
        draw = self._draw(plan, position)
        return draw[0] < _MARK_THRESHOLD and draw[1] < _PERIOD_THRESHOLD

    def token_at(self, plan: ReplyPlan, position: int) -> int:
        """The output token at ``position`` (0-based, resumed tokens counted)."""
        if self._is_period(plan, position):
            return self._period_id
        draw = self._draw(plan, position)
        if position % 3 == 2 and position < plan.natural_length - 2 and draw[0] < _MARK_THRESHOLD:
            return self._comma_id
        index = int.from_bytes(draw[2:6], "little") % plan.pool_size
        sentence_start = position == 0 or self._is_period(plan, position - 1)
        if sentence_start and index < _CAPITALIZED:
            return self._capital_ids[index]
        return self._word_ids[index]
