"""The simulator's next-token distribution, and sampling from it.

The simulated model's logits at a position (documented model, not a
network): every word of the position's *pool* (the sampler's vocabulary
prefix, scaled by ``top_p``) has logit 0; the position's punctuation mark,
when the reply's rhythm puts one there, has :data:`MARK_LOGIT`, so it is
all but certain; every other token is impossible, except that a token with a
``logit_bias`` outside the pool enters at :data:`OUT_OF_POOL_LOGIT`.

On top of that, as vLLM applies them: ``logit_bias`` is added; the presence
penalty is subtracted from every token already in the output, and the
frequency penalty times its count. Temperature divides the logits; greedy
decoding (no temperature) takes the argmax. Ties, and the draw of a
sample, are broken by the position's deterministic uniform draw ``u``, so
a token stays a function of (prompt, seed, position, earlier output).

Log probabilities are those of the distribution sampled from (after bias,
penalties and temperature; greedy ones at temperature 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

MARK_LOGIT = 30.0
"""A punctuation mark where the reply's rhythm puts one: e^30 outweighs any pool."""
OUT_OF_POOL_LOGIT = -10.0
"""Where a biased token outside the pool starts: +100 makes it near certain, +5 still rare."""


@dataclass(frozen=True)
class Adjustments:
    """``logit_bias`` and the penalties of one request."""

    bias: Mapping[int, float]
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty)

    def shift(self, token_id: int, counts: Mapping[int, int]) -> float:
        """What bias and penalties add to ``token_id``'s logit."""
        count = counts.get(token_id, 0)
        shift = self.bias.get(token_id, 0.0)
        if count:
            shift -= self.presence_penalty + self.frequency_penalty * count
        return shift


NO_ADJUSTMENTS = Adjustments({})


@dataclass(frozen=True)
class Pool:
    """Candidate tokens at logit 0: the first ``size`` of ``ids``;
    ``index`` maps each id of ``ids`` to its position."""

    ids: Sequence[int]
    index: Mapping[int, int]
    size: int

    @classmethod
    def of(cls, ids: Sequence[int], size: int | None = None) -> Pool:
        return cls(ids, {token_id: i for i, token_id in enumerate(ids)}, len(ids) if size is None else size)

    def sized(self, size: int) -> Pool:
        return Pool(self.ids, self.index, min(size, len(self.ids)))

    def __contains__(self, token_id: int) -> bool:
        return self.index.get(token_id, self.size) < self.size


class SampledToken(NamedTuple):
    """A sampled token, its log probability and the likeliest tokens at its
    position as (token id, log probability), most likely first. A named
    tuple: one is made per output token, so it must be cheap."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def sample(
    pool: Pool,
    u: float,
    *,
    marks: Mapping[int, float] | None = None,
    adjustments: Adjustments = NO_ADJUSTMENTS,
    counts: Mapping[int, int] | None = None,
    temperature: float | None = None,
    top: int = 0,
) -> SampledToken:
    """Sample one token with the uniform draw ``u`` in [0, 1). ``marks``
    are tokens with a base logit of their own (a pool word among them keeps
    it); ``counts`` are the output's token counts so far."""
    if not adjustments.bias and not adjustments.penalised and top <= 0:
        fast = _unadjusted(pool, u, marks or {}, temperature)
        if fast is not None:
            return fast
    counts = counts or {}
    logits: dict[int, float] = {}
    for token_id, base in (marks or {}).items():
        logits[token_id] = base + adjustments.shift(token_id, counts)
    touched = list(adjustments.bias)
    if adjustments.penalised:
        touched.extend(token_id for token_id in counts if token_id in pool)
    for token_id in touched:
        if token_id not in logits:
            base = 0.0 if token_id in pool else OUT_OF_POOL_LOGIT
            logits[token_id] = base + adjustments.shift(token_id, counts)
    # The pool's positions of adjusted words: the rest keep logit 0.
    adjusted = sorted(pool.index[token_id] for token_id in logits if token_id in pool)
    plain = pool.size - len(adjusted)
    best = max(logits.values(), default=-math.inf)
    if plain:
        best = max(best, 0.0)
    scale = temperature if temperature else 1.0
    weights = {token_id: math.exp((logit - best) / scale) for token_id, logit in logits.items()}
    plain_weight = math.exp(-best / scale) if plain else 0.0
    total = sum(weights.values()) + plain * plain_weight
    log_total = math.log(total)

    def logprob(logit: float) -> float:
        return (logit - best) / scale - log_total

    specials = sorted(logits)
    if not temperature:
        ties = [token_id for token_id in specials if logits[token_id] == best]
        tie_count = len(ties) + (plain if best == 0.0 else 0)
        pick = min(int(u * tie_count), tie_count - 1)
        chosen = ties[pick] if pick < len(ties) else _plain_member(pool, adjusted, pick - len(ties))
    else:
        chosen = _draw(pool, adjusted, specials, weights, plain, plain_weight, u * total)
    chosen_logit = logits.get(chosen, 0.0)
    return SampledToken(chosen, logprob(chosen_logit), _top(pool, adjusted, logits, top, logprob, chosen))


def _unadjusted(
    pool: Pool, u: float, marks: Mapping[int, float], temperature: float | None
) -> SampledToken | None:
    """:func:`sample`'s result for plain free text (no bias, no penalty, no
    top list, at most one mark outside the pool that beats the words) in
    constant time, as the general path computes it; None otherwise."""
    if len(marks) > 1:
        return None
    scale = temperature if temperature else 1.0
    if not marks:
        return SampledToken(pool.ids[min(int(u * pool.size), pool.size - 1)], -math.log(pool.size))
    ((mark, logit),) = marks.items()
    if logit <= 0 or mark in pool:
        return None
    word_weight = math.exp(-logit / scale)
    log_total = math.log(1.0 + pool.size * word_weight)
    if temperature:
        target = u * (1.0 + pool.size * word_weight) - 1.0
        if target >= 0 and word_weight > 0:
            word = pool.ids[min(int(target / word_weight), pool.size - 1)]
            return SampledToken(word, -logit / scale - log_total)
    return SampledToken(mark, -log_total)


def _draw(
    pool: Pool,
    adjusted: list[int],
    specials: list[int],
    weights: Mapping[int, float],
    plain: int,
    plain_weight: float,
    target: float,
) -> int:
    """Inverse-CDF sampling: specials in id order, then the plain pool words."""
    for token_id in specials:
        target -= weights[token_id]
        if target < 0:
            return token_id
    if plain and plain_weight > 0:
        return _plain_member(pool, adjusted, min(int(target / plain_weight), plain - 1))
    return specials[-1]  # rounding left the target just past the end


def _plain_member(pool: Pool, adjusted: list[int], k: int) -> int:
    """The ``k``-th pool word (0-based) whose logit was not adjusted."""
    position = k
    for skipped in adjusted:
        if skipped <= position:
            position += 1
        else:
            break
    return pool.ids[position]


def _top(
    pool: Pool,
    adjusted: list[int],
    logits: Mapping[int, float],
    count: int,
    logprob: Callable[[float], float],
    chosen: int,
) -> tuple[tuple[int, float], ...]:
    """The ``count`` likeliest tokens, most likely first. Among equally
    likely tokens the chosen one comes first, then the specials, then the
    plain pool words in pool order: so the chosen token is listed whenever
    its probability is among the top ``count`` (as vLLM's sampled token is
    always reported with its rank), never dropped for a tie with a word it
    equals."""
    if count <= 0:
        return ()
    candidates = [(logit, token_id != chosen, 0, token_id) for token_id, logit in logits.items()]
    plain = pool.size - len(adjusted)
    words = {_plain_member(pool, adjusted, k) for k in range(min(count, plain))}
    if chosen not in logits and chosen in pool:
        words.add(chosen)  # a plain word: logit 0 like the rest
    candidates.extend((0.0, token_id != chosen, 1, pool.index[token_id]) for token_id in words)
    candidates.sort(key=lambda item: (-item[0], item[1], item[2], item[3]))
    return tuple(
        (pool.ids[key] if kind else key, logprob(logit)) for logit, _, kind, key in candidates[:count]
    )
