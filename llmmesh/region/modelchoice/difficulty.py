"""How hard a chat request is, for ``auto``: a pluggable scorer and the
rules it starts with.

A :class:`DifficultyScorer` reads a request's :class:`RequestFeatures` and
answers a :class:`Difficulty`: a score in [0, 1], the smallest model tier
expected to do the job, and the signals behind it. The region then serves
the turn on the cheapest deployed model of that tier or above
(:mod:`region.modelchoice.difficulty_route`). :class:`RuleScorer` is the first scorer:
plain rules over prompt length, conversation depth and code, maths and
reasoning markers, then the tenant's tier and budget as caps. A trained
classifier can take its place behind the same Protocol.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from llmmesh.v1 import common_pb2, model_registry_service_pb2

ModelTier: TypeAlias = model_registry_service_pb2.ModelTier.ValueType

SMALL = model_registry_service_pb2.MODEL_TIER_SMALL
LARGE = model_registry_service_pb2.MODEL_TIER_LARGE
FRONTIER = model_registry_service_pb2.MODEL_TIER_FRONTIER

# Characters per token of English and code in a BPE vocabulary: the scorer
# runs before tokenization (it picks the tokenizer's model), so it estimates.
_CHARS_PER_TOKEN = 4

_CODE = re.compile(
    r"```|\bdef \w+\(|\bclass \w+[:(]|\bfunction\b|\bimport \w+|#include|=>|\breturn\b|;\s*$|"
    r"\b(?:python|javascript|typescript|rust|golang|java|sql|regex|compile[rs]?|debug|refactor|"
    r"stack trace|segfault|exception|algorithm|implement)\b",
    re.IGNORECASE | re.MULTILINE,
)
_MATHS = re.compile(
    r"\b(?:prove|proof|theorem|lemma|integral|derivative|equation|matrix|eigen\w*|probability|"
    r"polynomial|solve for|calculate|compute)\b|\d+\s*[-+*/^=]\s*\d+|[∫∑√π≤≥]",
    re.IGNORECASE,
)
_REASONING = re.compile(
    r"\b(?:step by step|explain why|reason(?:ing)? about|trade-?offs?|analy[sz]e|compare|"
    r"design an?|plan for|evaluate|justify)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RequestFeatures:
    """What the scorer may read of a request."""

    prompt_chars: int
    """Characters of the request's messages (a conversation's history included when known)."""
    depth: int
    """Turns in the conversation so far: user messages, the new one included."""
    text: str
    """The newest user message, where the markers are looked for."""
    tenant_tier: common_pb2.Tier.ValueType
    budget_left: float | None
    """Share of the tenant's monthly token quota still unused; None without a quota."""

    @property
    def prompt_tokens(self) -> int:
        """An estimate of the prompt's tokens."""
        return self.prompt_chars // _CHARS_PER_TOKEN


@dataclass(frozen=True)
class Difficulty:
    """A scorer's answer."""

    score: float
    """0 (chit-chat) to 1 (the hardest requests)."""
    tier: ModelTier
    """The smallest model tier expected to do the job, after the tenant's caps."""
    signals: tuple[str, ...]
    """What moved the score, for the route's detail ("long prompt", "code", …)."""
    capped_by_budget: bool = False
    """Whether the tenant's budget lowered the tier the score asked for."""


class DifficultyScorer(Protocol):
    """Scores a request; a pure function of its features."""

    def score(self, features: RequestFeatures) -> Difficulty: ...


@dataclass(frozen=True)
class RuleScorer:
    """The rules: each signal adds to the score, the score picks a tier.

    Length adds up to ``length_weight`` (linearly up to ``long_prompt_tokens``);
    a conversation at least ``deep_turns`` deep adds ``depth_weight``; code,
    maths and reasoning markers add their weights. At ``large_at`` the
    large tier is wanted, at ``frontier_at`` the frontier tier. Free tenants
    are capped at ``free_cap``; a tenant with less than ``low_budget`` of
    its quota left gets the small tier.
    """

    length_weight: float = 0.35
    long_prompt_tokens: int = 1500
    depth_weight: float = 0.15
    deep_turns: int = 8
    code_weight: float = 0.35
    maths_weight: float = 0.35
    reasoning_weight: float = 0.2
    large_at: float = 0.3
    frontier_at: float = 0.85
    free_cap: ModelTier = LARGE
    low_budget: float = 0.05

    def score(self, features: RequestFeatures) -> Difficulty:
        signals: list[str] = []
        score = self.length_weight * min(1.0, features.prompt_tokens / self.long_prompt_tokens)
        if features.prompt_tokens >= self.long_prompt_tokens // 3:
            signals.append("long prompt")
        if features.depth >= self.deep_turns:
            score += self.depth_weight
            signals.append("deep conversation")
        for name, pattern, weight in (
            ("code", _CODE, self.code_weight),
            ("maths", _MATHS, self.maths_weight),
            ("reasoning", _REASONING, self.reasoning_weight),
        ):
            if pattern.search(features.text):
                score += weight
                signals.append(name)
        score = min(1.0, score)
        tier = FRONTIER if score >= self.frontier_at else LARGE if score >= self.large_at else SMALL
        if features.tenant_tier == common_pb2.TIER_FREE and tier > self.free_cap:
            tier = self.free_cap
            signals.append("free tier")
        capped = False
        if features.budget_left is not None and features.budget_left < self.low_budget and tier > SMALL:
            tier, capped = SMALL, True
            signals.append("budget nearly spent")
        return Difficulty(round(score, 3), tier, tuple(signals), capped)


def features_of(
    messages: list[common_pb2.ChatMessage],
    tenant_tier: common_pb2.Tier.ValueType,
    budget_left: float | None,
    history_chars: int = 0,
    history_turns: int = 0,
) -> RequestFeatures:
    """The features of a request of ``messages``; ``history_chars`` and
    ``history_turns`` add a stored conversation's history."""
    users = [m.content for m in messages if m.role == common_pb2.CHAT_ROLE_USER]
    return RequestFeatures(
        prompt_chars=history_chars + sum(len(m.content) for m in messages),
        depth=history_turns + len(users),
        text=users[-1] if users else "",
        tenant_tier=tenant_tier,
        budget_left=budget_left,
    )
