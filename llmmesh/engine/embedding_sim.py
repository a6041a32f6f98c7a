"""The simulator's embedding model: signed feature hashing of token n-grams.

What it models, and what not. A real embedding model (vLLM pooling a
transformer's hidden states) maps text to a unit vector such that texts
sharing content lie close together. This model does the same with no
weights at all, a random projection of a bag of n-grams (the "hashing
trick" made dense):

- the input's token ids (:class:`engine.sim.tokenizer.SimTokenizer`, no
  special tokens; a token array is taken as given) yield every unigram
  (weight 1) and bigram (weight 0.5) of consecutive ids;
- each n-gram's BLAKE2b hash stream (a fixed personalisation) gives it a
  vector of +1/-1 components, one bit each;
- the vector is the weighted sum of its n-grams' vectors, L2-normalised.

So the vector is a deterministic function of the token ids, the same on
every pod and process; texts sharing n-grams have a clearly positive
cosine similarity, unrelated texts one near 0, and one text and its own
token ids embed identically. Every prefix of the vector is itself a random
projection of the same bag (Johnson-Lindenstrauss), so cutting it to
``dimensions`` components keeps similarities approximately, as a
Matryoshka-trained model's does. It knows no meaning (synonyms are
unrelated), and its cost is not modelled: it runs as fast as hashing does,
with no batching or queueing delay.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from llmmesh.engine.embedding import EmbeddingBackend, EmbeddingModelInfo, normalised
from llmmesh.engine.sim.tokenizer import SimTokenizer

_PERSON = b"llmmesh-emb-v1"
# Weight of an n-gram by its length: single tokens carry most of the signal.
_WEIGHTS = {1: 1.0, 2: 0.5}
# Batches bigger than this many tokens are hashed off the event loop.
_INLINE_TOKENS = 1024


# About 2 KiB per entry (the two sign floats are shared constants): 8 MiB at most.
@lru_cache(maxsize=4096)
def _signs(ngram: tuple[int, ...], dimensions: int) -> tuple[float, ...]:
    """The n-gram's +1/-1 vector: the bits of its BLAKE2b hash stream."""
    packed = struct.pack(f"<{len(ngram)}I", *ngram)
    stream = bytearray()
    block = 0
    while len(stream) * 8 < dimensions:
        stream += hashlib.blake2b(
            packed, digest_size=64, person=_PERSON, salt=block.to_bytes(16, "little")
        ).digest()
        block += 1
    bits = int.from_bytes(stream, "little")
    return tuple(-1.0 if (bits >> i) & 1 else 1.0 for i in range(dimensions))


def hashed_vector(token_ids: Sequence[int], dimensions: int) -> list[float]:
    """The unit vector of ``token_ids`` (see the module docstring)."""
    ids = tuple(token_ids)
    bag: Counter[tuple[int, ...]] = Counter()
    for size in _WEIGHTS:
        bag.update(ids[start : start + size] for start in range(len(ids) - size + 1))
    vector = [0.0] * dimensions
    for ngram, count in bag.items():
        weight = _WEIGHTS[len(ngram)] * count
        vector = [v + weight * s for v, s in zip(vector, _signs(ngram, dimensions), strict=True)]
    return list(normalised(vector))


class SimEmbeddingBackend(EmbeddingBackend):
    """Hashed n-gram embeddings over the simulator's tokenizer."""

    def __init__(self, model: str, dimensions: int, max_input_tokens: int) -> None:
        if dimensions <= 0 or max_input_tokens <= 0:
            raise ValueError("embedding dimensions and max input tokens must be positive")
        self._tokenizer = SimTokenizer()
        self._info = EmbeddingModelInfo(
            model=model,
            backend="sim",
            dimensions=dimensions,
            max_input_tokens=max_input_tokens,
            vocab_size=self._tokenizer.vocab_size,
        )

    def info(self) -> EmbeddingModelInfo:
        return self._info

    async def start(self) -> None:
        """Nothing to load: the model has no weights."""

    async def close(self) -> None:
        """Nothing to release."""

    async def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text))

    async def embed(self, batch: Sequence[tuple[int, ...]]) -> list[list[float]]:
        dimensions = self._info.dimensions

        def run() -> list[list[float]]:
            return [hashed_vector(ids, dimensions) for ids in batch]

        if sum(len(ids) for ids in batch) <= _INLINE_TOKENS:
            return run()
        return await asyncio.to_thread(run)
