"""Chunking and reciprocal-rank fusion of retrieval."""

from __future__ import annotations

import pytest

from llmmesh.region.knowledge.vector_store_text import chunk_text, query_terms, reciprocal_rank_fusion


def test_chunks_overlap_and_cover_the_text() -> None:
    text = " ".join(f"word{n}" for n in range(200))
    pieces = chunk_text(text, 100, 20)
    assert all(len(p) <= 100 for p in pieces)
    assert pieces[0].startswith("word0") and pieces[-1].endswith("word199")
    words = set(text.split())
    assert set(" ".join(pieces).split()) == words
    with pytest.raises(ValueError, match="overlap"):
        chunk_text(text, 10, 10)


def test_fusion_prefers_chunks_both_rankings_agree_on() -> None:
    fused = reciprocal_rank_fusion([1, 2, 3], [3, 1])
    assert [f.chunk_id for f in fused] == [1, 3, 2]
    assert fused[0].score == pytest.approx((1 / 61 + 1 / 62) / (2 / 61))
    assert reciprocal_rank_fusion([7], [7])[0].score == pytest.approx(1.0)


def test_query_terms_are_distinct_lower_case_words() -> None:
    assert query_terms("What is the Capital of capital? NEAR(x)") == [
        "what",
        "is",
        "the",
        "capital",
        "of",
        "near",
        "x",
    ]
