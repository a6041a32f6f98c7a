"""Text handling of retrieval: cutting a file into overlapping chunks, the
words of a full-text query, and reciprocal-rank fusion of two rankings."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

RRF_K = 60
"""The constant of reciprocal-rank fusion (Cormack et al. 2009): a rank r adds 1/(RRF_K + r)."""
MAX_QUERY_TERMS = 32
_WORD = re.compile(r"\w+", re.UNICODE)


def chunk_text(text: str, max_chars: int, overlap_chars: int) -> list[str]:
    """``text`` cut into chunks of at most ``max_chars`` characters, each
    starting ``overlap_chars`` (about) before the previous one ended.

    A chunk ends at the last whitespace inside its window when that keeps
    at least half the window, so words are rarely split; blank chunks are
    left out. ValueError unless ``0 <= overlap_chars < max_chars``.
    """
    if max_chars < 1 or not 0 <= overlap_chars < max_chars:
        raise ValueError("chunks need max_chars >= 1 and 0 <= overlap_chars < max_chars")
    pieces: list[str] = []
    start = 0
    length = len(text)
    while start < length:
        end = min(start + max_chars, length)
        if end < length:
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            if cut > start + max_chars // 2:
                end = cut
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        if end >= length:
            break
        # The next chunk starts overlap_chars back, at a word start when one is near.
        next_start = max(end - overlap_chars, start + 1)
        space = text.find(" ", next_start, end)
        if overlap_chars and space != -1:
            next_start = space + 1
        start = next_start
    return pieces


def query_terms(query: str) -> list[str]:
    """The distinct lower-cased words of ``query``, in order, at most :data:`MAX_QUERY_TERMS`."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
        if len(seen) == MAX_QUERY_TERMS:
            break
    return list(seen)


@dataclass(frozen=True)
class Fused:
    """One chunk's place in the fused ranking."""

    chunk_id: int
    # 1.0 for a chunk ranked first by both rankings.
    score: float
    # Its rank in each ranking from 1; 0 where it was not ranked.
    vector_rank: int
    text_rank: int


def reciprocal_rank_fusion(vector_ranked: Sequence[int], text_ranked: Sequence[int]) -> list[Fused]:
    """Both rankings (chunk ids, best first) fused, best first; ties keep the vector order."""
    ranks: dict[int, list[int]] = {}
    for rank, chunk in enumerate(vector_ranked, 1):
        ranks.setdefault(chunk, [0, 0])[0] = rank
    for rank, chunk in enumerate(text_ranked, 1):
        ranks.setdefault(chunk, [0, 0])[1] = rank
    best = 2 / (RRF_K + 1)
    fused = [
        Fused(
            chunk,
            sum(1 / (RRF_K + r) for r in (v, t) if r) / best,
            v,
            t,
        )
        for chunk, (v, t) in ranks.items()
    ]
    order = {chunk: i for i, chunk in enumerate([*vector_ranked, *text_ranked])}
    fused.sort(key=lambda f: (-f.score, order[f.chunk_id]))
    return fused
