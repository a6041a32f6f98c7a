"""What a safety check decided: :class:`Verdict` and the category names.

Categories use OpenAI's moderation names exactly, so a verdict maps onto the
``moderation`` object and ``finish_reason: content_filter`` without a table.
Two extensions are ours: ``pii`` (payment cards, emails, phone numbers,
national ids) and ``prompt_injection`` (attempts to override the system's
instructions; checked on input only).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

HARASSMENT = "harassment"
HARASSMENT_THREATENING = "harassment/threatening"
HATE = "hate"
HATE_THREATENING = "hate/threatening"
ILLICIT = "illicit"
ILLICIT_VIOLENT = "illicit/violent"
SELF_HARM = "self-harm"
SELF_HARM_INTENT = "self-harm/intent"
SELF_HARM_INSTRUCTIONS = "self-harm/instructions"
SEXUAL = "sexual"
SEXUAL_MINORS = "sexual/minors"
VIOLENCE = "violence"
VIOLENCE_GRAPHIC = "violence/graphic"
# Extensions: not OpenAI moderation categories.
PII = "pii"
PROMPT_INJECTION = "prompt_injection"

OPENAI_CATEGORIES: tuple[str, ...] = (
    HARASSMENT,
    HARASSMENT_THREATENING,
    HATE,
    HATE_THREATENING,
    ILLICIT,
    ILLICIT_VIOLENT,
    SELF_HARM,
    SELF_HARM_INTENT,
    SELF_HARM_INSTRUCTIONS,
    SEXUAL,
    SEXUAL_MINORS,
    VIOLENCE,
    VIOLENCE_GRAPHIC,
)
EXTENSION_CATEGORIES: tuple[str, ...] = (PII, PROMPT_INJECTION)
ALL_CATEGORIES: tuple[str, ...] = OPENAI_CATEGORIES + EXTENSION_CATEGORIES

CheckKind = Literal["input", "output"]
"""What is checked: the caller's messages or the model's reply."""


def require_categories(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a tuple, or ValueError naming the first unknown category."""
    result = tuple(names)
    for name in result:
        if name not in ALL_CATEGORIES:
            raise ValueError(f"unknown safety category {name!r}; known: {', '.join(ALL_CATEGORIES)}")
    return result


def _ordered(names: Iterable[str]) -> tuple[str, ...]:
    found = set(names)
    return tuple(name for name in ALL_CATEGORIES if name in found)


@dataclass(frozen=True)
class Verdict:
    """One backend's decision about one text.

    ``flagged`` means the text must not pass: ``categories`` then names the
    blocking categories found. ``reported`` names categories that were found
    but are configured as report-only; they never block. ``reason`` is a short
    human-readable explanation that never quotes the checked text (it may be
    personal data).
    """

    flagged: bool
    categories: tuple[str, ...]
    reason: str
    backend: str
    reported: tuple[str, ...] = ()

    @classmethod
    def safe(cls, backend: str) -> Verdict:
        return cls(flagged=False, categories=(), reason="", backend=backend)

    @classmethod
    def of(cls, found: Iterable[str], *, report_only: Collection[str], reason: str, backend: str) -> Verdict:
        """The verdict for ``found`` categories, split by ``report_only``."""
        ordered = _ordered(found)
        blocking = tuple(c for c in ordered if c not in report_only)
        reported = tuple(c for c in ordered if c in report_only)
        return cls(
            flagged=bool(blocking),
            categories=blocking,
            reason=reason if ordered else "",
            backend=backend,
            reported=reported,
        )
