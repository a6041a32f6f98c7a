"""What a text must contain for a rule to match it: a check that skips the
rule's regex search on most text.

A regex search tries its pattern at every position of the text; for a
prompt of a few kilobytes and the built-in prompt-injection markers that
is a few hundred microseconds a turn on the region's event loop, though
almost no prompt holds a marker. Each rule here gets a :class:`Needs`:
strings at least one of which (per clause) must occur in the text,
case-insensitively, for the rule to match at all. A substring test of each
is far cheaper than the search; only a text that passes every clause is
searched.

The clauses are derived from the pattern itself (:func:`needs_of`),
conservatively: literal runs the pattern cannot match without, through
groups and repeats of at least one, and one string of each alternative of
a branch; whatever the derivation cannot read (classes, look-arounds,
back-references) it leaves out, which only makes the test pass more often.
The test runs on the lower-cased text and only where the text is ASCII:
there case-insensitive matching of an ASCII literal is exactly lower-casing
both, whereas a few non-ASCII characters match ASCII letters under
``re.IGNORECASE`` (the Kelvin sign a ``k``, the long s an ``s``). A non-ASCII
text is always searched.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

# The regex parser of the standard library (sre), which reads a pattern as its
# engine does; it has no type stubs.
_sre: Any = importlib.import_module("re._parser")

# Literal runs shorter than this say too little to be worth a test.
_SHORTEST = 2


class Needs:
    """Clauses of strings (lower-case ASCII): a text may match only if, for
    every clause, it contains one of its strings. No clause: no test."""

    __slots__ = ("clauses",)

    def __init__(self, clauses: Iterable[Sequence[str]]) -> None:
        self.clauses = tuple(tuple(dict.fromkeys(clause)) for clause in clauses if clause)

    def __bool__(self) -> bool:
        return bool(self.clauses)

    def __repr__(self) -> str:
        return f"Needs({list(self.clauses)!r})"

    def met_by(self, lowered: str) -> bool:
        """Whether ``lowered`` (an ASCII text, lower-cased) contains what every clause asks."""
        return all(any(s in lowered for s in clause) for clause in self.clauses)


def needs_of(pattern: re.Pattern[str]) -> Needs:
    """What ``pattern`` needs (see the module's note); no clause where it
    cannot tell."""
    try:
        parsed = _sre.parse(pattern.pattern, pattern.flags)
    except Exception:  # pragma: no cover - a compiled pattern always parses
        return Needs(())
    return Needs(_sequence(list(parsed)))


_WORD_RUN = re.compile(r"\w+")


class TermWords:
    """What a text needs for one of the deny-list terms to match: every word
    of the term. A term matches whole words (no word character on either
    side, whitespace between its words), so each run of word characters in
    it is a whole run of word characters of the text: the test looks the
    term's runs up in the set of the text's, by way of each term's longest
    run (most terms share no run with most texts, and are not looked at)."""

    __slots__ = ("_by_key",)

    def __init__(self, terms: Iterable[str]) -> None:
        self._by_key: dict[str, list[frozenset[str]]] = {}
        for term in terms:
            runs = frozenset(_WORD_RUN.findall(term.lower()))
            if runs:
                self._by_key.setdefault(max(runs, key=len), []).append(runs)

    @classmethod
    def of(cls, terms: Iterable[str]) -> TermWords | None:
        """The test for ``terms``; ``None`` where a term is not ASCII (always
        search) or has no word character (the test could not see it)."""
        listed = [term for term in terms if term.strip()]
        if not all(term.isascii() and _WORD_RUN.search(term) for term in listed):
            return None
        return cls(listed)

    def met_by(self, lowered: str) -> bool:
        """Whether ``lowered`` (an ASCII text, lower-cased) holds every word
        of some term."""
        runs = set(_WORD_RUN.findall(lowered))
        return any(needed <= runs for key in self._by_key.keys() & runs for needed in self._by_key[key])


def lowered_if_ascii(text: str) -> str | None:
    """``text`` lower-cased where :class:`Needs` may test it (ASCII), else ``None``."""
    return text.lower() if text.isascii() else None


def _sequence(items: list[tuple[Any, Any]]) -> list[tuple[str, ...]]:
    """The clauses a sequence of parsed items needs: each literal run, and
    what each item that must occur needs."""
    clauses: list[tuple[str, ...]] = []
    run: list[str] = []

    def flush() -> None:
        text = "".join(run)
        if len(text) >= _SHORTEST and text.isascii():
            clauses.append((text.lower(),))
        run.clear()

    for op, av in items:
        if op is _sre.LITERAL:
            run.append(chr(av))
            continue
        flush()
        if op is _sre.SUBPATTERN:
            clauses.extend(_sequence(list(av[-1])))
        elif op is _sre.ATOMIC_GROUP:
            clauses.extend(_sequence(list(av)))
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT):
            low, _, body = av
            if low >= 1:
                clauses.extend(_sequence(list(body)))
        elif op is _sre.BRANCH:
            # One clause: a string from each alternative (any alternative may be the one that matches).
            either: list[str] = []
            for alternative in av[1]:
                needed = _sequence(list(alternative))
                if not needed:
                    either = []
                    break
                either.extend(max(needed, key=lambda clause: min(map(len, clause))))
            if either:
                clauses.append(tuple(either))
        # Anything else (classes, anchors, look-arounds, references) needs nothing we can name.
    flush()
    return clauses
