"""The settings the safety filters are built from.

:class:`SafetyValues` is what :func:`region.safety.build_filters` reads, so
any settings object carrying these fields (the region's own, once it adopts
them) can be passed; :class:`SafetySettings` is a ready-made one with the
defaults and descriptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmmesh.core.config import setting
from llmmesh.region.safety.verdict import require_categories


class SafetyValues(Protocol):
    """The safety fields of a settings object."""

    @property
    def safety_backends(self) -> str: ...
    @property
    def safety_report_only(self) -> str: ...
    @property
    def safety_deny_terms(self) -> str: ...
    @property
    def safety_timeout_s(self) -> float: ...
    @property
    def safety_retry_after_s(self) -> float: ...
    @property
    def safety_window_chars(self) -> int: ...
    @property
    def safety_overlap_chars(self) -> int: ...
    @property
    def safety_hold_first_word(self) -> bool: ...


@dataclass(frozen=True)
class SafetySettings:
    """Which safety backends run and how the output stream is windowed."""

    safety_backends: str = setting("rules", "comma-separated safety backends: rules, judge, both or none")
    safety_report_only: str = setting("", "comma-separated categories that are reported but never block")
    safety_deny_terms: str = setting("", "extra deny-list terms, as 'category=term|term;category=term'")
    safety_timeout_s: float = setting(5.0, "seconds one safety backend may take before the turn fails")
    safety_retry_after_s: float = setting(1.0, "retry delay suggested when the safety check is unavailable")
    safety_window_chars: int = setting(256, "characters of streamed output one safety check sees")
    safety_overlap_chars: int = setting(
        64, "characters consecutive output windows share; with the judge, held back until rechecked"
    )
    safety_hold_first_word: bool = setting(
        False,
        "hold a streamed word that may begin a deny-listed phrase of several words until the next word "
        "tells; off: the phrase is held from its second word, so its first word may reach the client",
    )


def parse_categories(raw: str) -> tuple[str, ...]:
    """``'pii, sexual'`` as known category names."""
    return require_categories(name.strip() for name in raw.split(",") if name.strip())


def parse_term_lists(raw: str) -> dict[str, tuple[str, ...]]:
    """``'violence=beat him up|stab him;hate=...'`` as terms per category."""
    terms: dict[str, tuple[str, ...]] = {}
    for entry in raw.split(";"):
        if not entry.strip():
            continue
        category, sep, listed = entry.partition("=")
        if not sep:
            raise ValueError(f"deny terms entry {entry!r} is not 'category=term|term'")
        (name,) = require_categories([category.strip()])
        found = tuple(term.strip() for term in listed.split("|") if term.strip())
        terms[name] = terms.get(name, ()) + found
    return terms
