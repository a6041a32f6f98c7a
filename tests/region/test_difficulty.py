"""The rule scorer behind ``auto``: signals raise the score, the score picks
a tier, the tenant's tier and budget cap it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmmesh.region.modelchoice.difficulty import FRONTIER, LARGE, SMALL, Difficulty, RuleScorer, features_of
from llmmesh.v1 import common_pb2

PRO, FREE = common_pb2.TIER_PRO, common_pb2.TIER_FREE


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)


def score(
    text: str, tier: common_pb2.Tier.ValueType = PRO, budget: float | None = None, turns: int = 0
) -> Difficulty:
    return RuleScorer().score(features_of([user(text)], tier, budget, history_turns=turns))


def test_chit_chat_wants_the_small_tier() -> None:
    easy = score("Hi! How are you today?")
    assert easy.tier == SMALL and easy.signals == () and easy.score < 0.1


def test_code_and_maths_want_a_larger_tier() -> None:
    code = score("Fix this:\n```python\ndef f(x):\n    return x +\n```")
    assert code.tier == LARGE and "code" in code.signals
    maths = score("Prove the theorem that the integral of 2 * x is x^2.")
    assert maths.tier == LARGE and "maths" in maths.signals
    both = score("Implement the algorithm in Python and prove it converges; explain why step by step. " * 60)
    assert both.tier == FRONTIER and {"code", "maths", "reasoning", "long prompt"} <= set(both.signals)


def test_a_deep_conversation_counts() -> None:
    assert "deep conversation" in score("and then?", turns=12).signals


def test_free_tenants_are_capped_and_a_spent_budget_gets_the_small_tier() -> None:
    hard = "Implement the algorithm in Python and prove it converges; explain why step by step. " * 60
    assert score(hard, FREE).tier == LARGE
    spent = score(hard, PRO, budget=0.01)
    assert spent.tier == SMALL and spent.capped_by_budget
    assert score(hard, PRO, budget=0.5).tier == FRONTIER


@given(st.text(max_size=3000), st.integers(0, 50), st.sampled_from([PRO, FREE]))
def test_the_score_stays_in_range_and_more_text_never_lowers_it(
    text: str, turns: int, tier: common_pb2.Tier.ValueType
) -> None:
    first = RuleScorer().score(features_of([user(text)], tier, None, history_turns=turns))
    assert 0.0 <= first.score <= 1.0
    longer = RuleScorer().score(
        features_of([user(text)], tier, None, history_chars=8000, history_turns=turns)
    )
    assert longer.score >= first.score
