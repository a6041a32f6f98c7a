"""Texts for the safety property tests, built from pieces that come close to
a rule or make one match (a deny-listed phrase, card numbers, phone and id
numbers, an email address), and where the rules match in them."""

from __future__ import annotations

import itertools
import re
from typing import NamedTuple

from hypothesis import strategies as st

from llmmesh.region.safety import RulesBackend, luhn_valid
from llmmesh.region.safety.rules import _EMAIL, _NATIONAL_IDS, _PHONES

TERM = "forbidden phrase"
PIECES = [
    *("the", "a", "mass", "é", "日本語", "x_y", "AB"),
    *("forb", "forbidden", "FORBIDDEN", "phr", "phrase", TERM, "forbidden\n phrase", "forbiddenphrase"),
    *("4111", "1111", "12", "3782", "822463", "10005", "378282246310005", "5555555555554444"),
    *("4000000000000000006", "400000000000", "0000006"),  # a 19-digit card, whole and in parts
    *("555", "123", "4567", "45", "6789", "(555)", "+1", "+14155552671"),
    *("jane", "@", "example.com", "a.b", "JG", "10", "37", "59", "A"),
]
SEPARATORS = [" ", "  ", "\n", ", ", ". ", "-", "'", ""]

_TERM = re.compile(r"(?<!\w)forbidden\s+phrase(?!\w)", re.IGNORECASE)
_FIRST_WORD = re.compile(r"forbidden\s+", re.IGNORECASE)
_RUN = re.compile(r"\d(?:[ -]?\d)*")


@st.composite
def texts(draw: st.DrawFn, max_pieces: int = 40) -> str:
    pieces = draw(st.lists(st.sampled_from(PIECES), max_size=max_pieces))
    separators = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(pieces), max_size=len(pieces)))
    return "".join(piece + separator for piece, separator in zip(pieces, separators, strict=True))


def rules(*, hold_first_word: bool = True) -> RulesBackend:
    """The deny-listed ``TERM`` and the built-in PII rules; without
    ``hold_first_word``, the term's first word may be let out."""
    return RulesBackend(deny_terms={"violence": [TERM]}, builtin=False, hold_first_word=hold_first_word)


def _card_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for run in _RUN.finditer(text):
        groups = re.split("[ -]", run.group())
        edges = list(itertools.accumulate((len(g) + 1 for g in groups), initial=run.start()))
        for first, last in itertools.combinations(range(len(groups) + 1), 2):
            digits = "".join(groups[first:last])
            if 13 <= len(digits) <= 19 and luhn_valid(digits):
                spans.append((edges[first], edges[last] - 1))
    return spans


class Match(NamedTuple):
    """A rule's match: its span, and ``guarded``, where the part no filter
    may release before the match is checked begins (an email address's
    ``@``; the term's second word where its first may be let out; the start
    for every other rule)."""

    start: int
    end: int
    guarded: int


def _guarded(pattern: re.Pattern[str], match: re.Match[str], hold_first_word: bool) -> int:
    if pattern is _EMAIL:
        return match.string.index("@", match.start())
    if pattern is _TERM and not hold_first_word:
        first = _FIRST_WORD.match(match.string, match.start())
        assert first is not None
        return first.end()
    return match.start()


def matches(text: str, since: int = 0, *, hold_first_word: bool = True) -> list[Match]:
    """The rules' matches in ``text`` (ASCII and normal forms only) whose
    guarded part begins at ``since`` or later: one per pattern and start."""
    found = [
        Match(*match.span(), _guarded(pattern, match, hold_first_word))
        for pattern in (_TERM, _EMAIL, *_PHONES, *_NATIONAL_IDS)
        for start in range(len(text))
        if (match := pattern.match(text, start)) is not None
    ]
    found += [Match(start, end, start) for start, end in _card_spans(text)]
    return [match for match in found if match.guarded >= since]
