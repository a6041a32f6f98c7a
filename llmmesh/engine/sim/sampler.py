"""Deterministic output for the simulator.

The output token at position ``i`` is a pure function of (prompt token ids,
seed, ``i``, the output tokens before ``i``): resumed output tokens are part
of that history, so a generation resumed at offset ``k`` after a failover
produces exactly the tokens ``k, k+1, …`` the uninterrupted one would have,
which is what session rehydration needs a simulator to prove. Without
penalties only the previous token matters (a capital follows a full stop).

Greedy decoding (temperature 0 or unset) ignores the seed and draws from a
narrow pool of frequent words, as greedy output is repetitive; sampling with
a temperature uses the seed (or, without one, the prompt alone) and a pool
scaled by ``top_p``. Each position's token is sampled from the documented
distribution of :mod:`engine.sim.distribution` (logit bias, penalties,
temperature, log probabilities) with the position's own uniform draw. Text
reads as lower-case sentences: words with leading spaces, the odd comma or
full stop (the reply's rhythm, fixed by the plan), a capital after a full
stop, and a full stop at the natural end of the reply.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmmesh.engine.backend import SamplingOptions
from llmmesh.engine.sim.distribution import MARK_LOGIT, Adjustments, Pool, SampledToken, sample
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.sim.vocabulary import WORDS

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
    temperature: float | None = None
    adjustments: Adjustments = field(default_factory=lambda: Adjustments({}))
    top_logprobs: int = 0


@dataclass
class OutputHistory:
    """The output tokens so far (resumed ones first) and their counts."""

    tokens: list[int] = field(default_factory=list)
    counts: Counter[int] = field(default_factory=Counter)

    @classmethod
    def of(cls, token_ids: Iterable[int]) -> OutputHistory:
        history = cls()
        for token_id in token_ids:
            history.append(token_id)
        return history

    def append(self, token_id: int) -> None:
        self.tokens.append(token_id)
        self.counts[token_id] += 1


def draw_bytes(digest: bytes, position: int) -> bytes:
    """The position's 8 random bytes, a function of the plan's digest."""
    return hashlib.blake2b(digest + position.to_bytes(8, "little"), digest_size=8).digest()


def uniform(draw: bytes) -> float:
    """A draw's bytes 2 to 5 as a number in (0, 1): the middle of one of
    2^32 equal steps, so a token banned with a bias of -100 (a weight of
    e^-100) is never drawn, as it never is in vLLM."""
    return (int.from_bytes(draw[2:6], "little") + 0.5) / 2**32


class DeterministicSampler:
    """Maps (prompt, sampling options, position, earlier output) to a token."""

    def __init__(self, tokenizer: SimTokenizer) -> None:
        word_ids = [tokenizer.piece_id(" " + word) for word in WORDS]
        capital_ids = [tokenizer.piece_id(" " + word.capitalize()) for word in WORDS[:_CAPITALIZED]]
        self.words = Pool.of(word_ids)
        self.sentence_starts = Pool.of(capital_ids + word_ids[_CAPITALIZED:])
        self.bare_words = Pool.of([tokenizer.piece_id(word) for word in WORDS])
        self._comma_id = tokenizer.piece_id(",")
        self._period_id = tokenizer.piece_id(".")
        self._pools: dict[tuple[bool, int], Pool] = {}

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
            pool = max(GREEDY_POOL // 4, round(len(self.words.ids) * top_p))
        adjustments = Adjustments(
            dict(sampling.logit_bias),
            sampling.presence_penalty or 0.0,
            sampling.frequency_penalty or 0.0,
        )
        top = (sampling.top_logprobs or 0) if sampling.logprobs else 0
        return ReplyPlan(value, natural_length, pool, sampling.temperature or None, adjustments, top)

    def _mark_at(self, plan: ReplyPlan, position: int, draw: bytes) -> int | None:
        """The punctuation mark the reply's rhythm puts at ``position``, if any:
        marks only at every third position and never right before the final
        stop, so two marks never touch; the last position is a full stop."""
        if position == plan.natural_length - 1:
            return self._period_id
        if position % 3 != 2 or position >= plan.natural_length - 2 or draw[0] >= _MARK_THRESHOLD:
            return None
        return self._period_id if draw[1] < _PERIOD_THRESHOLD else self._comma_id

    def sample(self, plan: ReplyPlan, position: int, history: OutputHistory) -> SampledToken:
        """The output token at ``position`` (0-based, resumed tokens counted)
        after the output ``history`` (exactly ``position`` tokens)."""
        draw = draw_bytes(plan.digest, position)
        mark = self._mark_at(plan, position, draw)
        sentence_start = not history.tokens or history.tokens[-1] == self._period_id
        pool = self._pool(sentence_start, plan.pool_size)
        return sample(
            pool,
            uniform(draw),
            marks={mark: MARK_LOGIT} if mark is not None else None,
            adjustments=plan.adjustments,
            counts=history.counts,
            temperature=plan.temperature,
            top=plan.top_logprobs,
        )

    def _pool(self, sentence_start: bool, size: int) -> Pool:
        key = (sentence_start, size)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = (self.sentence_starts if sentence_start else self.words).sized(size)
        return pool

    def token_at(self, plan: ReplyPlan, position: int, history: OutputHistory) -> int:
        """The output token at ``position`` after ``history``."""
        return self.sample(plan, position, history).token_id

    def tokens(self, plan: ReplyPlan, count: int, resumed: Sequence[int] = ()) -> list[int]:
        """The ``count`` output tokens after ``resumed`` (an uninterrupted run's view)."""
        history = OutputHistory.of(resumed)
        produced: list[int] = []
        for position in range(len(resumed), len(resumed) + count):
            token_id = self.token_at(plan, position, history)
            history.append(token_id)
            produced.append(token_id)
        return produced
