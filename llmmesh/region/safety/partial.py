"""Where, in a text still streaming, a rule could yet match.

:meth:`region.safety.RulesBackend.hold_from` answers with these so that the
output filter holds back only what text still to come could turn into (part
of) a match, instead of a fixed overlap. Every answer errs early: a position
reported too early only delays text a little, one reported too late would
let part of a flagged phrase out.

The rules match with :mod:`re`; partial matching needs the :mod:`regex`
module, whose ``\\w``, ``\\d`` and ``\\s`` differ from ``re``'s for a few
thousand characters (combining marks, some symbols, characters newer than
this Python's Unicode tables) and whose case folding differs for the dotless
i. So deny-list terms get a prefix pattern of their own in ``re``, and texts
for ``regex`` patterns have those few characters replaced by stand-ins that
both engines classify as ``re`` classifies the originals (:func:`proxied`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import unicodedata
from collections.abc import Iterable
from typing import NamedTuple

import regex

_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
# The ASCII characters canonical composition can merge with a following mark.
_COMPOSING_ASCII = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz<=>")


def normalise(text: str) -> str:
    """The form the rules match: compatibility forms (full-width letters,
    ligatures) folded and invisible characters dropped, both classic ways
    around a deny list. ASCII text is its own normal form."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE)


class Normalised(NamedTuple):
    """``normalise(original)`` and the way back to offsets in ``original``
    (a named tuple: the output filter makes one for every delta)."""

    text: str
    starts: tuple[int, ...] | None
    """Where each original character's normal form begins in ``text`` (one
    more entry for the end); ``None`` when offsets are the same."""

    @classmethod
    def of(cls, original: str) -> Normalised | None:
        """``None`` when ``original`` does not normalise character by
        character (decomposed accents, conjoining jamo), so that its offsets
        cannot be mapped exactly."""
        if original.isascii():
            return cls(original, None)
        text = normalise(original)
        if text == original:
            return cls(text, None)
        parts = [normalise(char) for char in original]
        if "".join(parts) != text:
            return None
        return cls(text, tuple(itertools.accumulate(map(len, parts), initial=0)))

    def to_normal(self, offset: int) -> int:
        return offset if self.starts is None else self.starts[offset]

    def to_original(self, offset: int) -> int:
        """The original character whose normal form holds ``offset`` (the end
        maps to the end): the earliest that must be held for it."""
        return offset if self.starts is None else bisect.bisect_right(self.starts, offset) - 1


def settled_end(text: str) -> int:
    """How much of ``text`` keeps its normal form whatever follows: all of it,
    unless its last base character could still compose with a mark to come
    (``e`` then U+0301 normalise to ``é``)."""
    if not text or (text[-1].isascii() and text[-1] not in _COMPOSING_ASCII):
        return len(text)
    end = len(text) - 1
    while end > 0 and unicodedata.combining(text[end]):
        end -= 1
    return end


def _word_prefix(word: str, then: str) -> str:
    """Every non-empty prefix of ``word``, the whole word followed by ``then``
    (itself optional)."""
    pattern = then
    for char in reversed(word[1:]):
        pattern = f"(?:{re.escape(char)}{pattern})?"
    return re.escape(word[0]) + pattern


RELEASED_WORD_CHARS = 32
"""The longest first word of a deny-list phrase :func:`term_prefixes` may
leave out of its holds (``hold_first_word=False``); a longer one is held as
any other part of its phrase."""


def term_prefixes(terms: Iterable[str], *, hold_first_word: bool = True) -> re.Pattern[str] | None:
    """A pattern that matches, at the end of a text, every non-empty prefix of
    a deny-list match of ``terms`` (whole words, case-insensitive, any run of
    whitespace between words), whole terms included; the rules' own engine,
    so its word edges and case folding are theirs.

    Without ``hold_first_word``, a phrase of two or more words (its first no
    longer than :data:`RELEASED_WORD_CHARS`) matches only once whitespace
    follows its first word: the word alone, a common one (a phrase's words
    are not flagged one by one), is nothing to hold, and the phrase is held
    from what follows it. The match still begins at the first word, so a
    search must start there (see :func:`word_before`)."""
    alternatives: set[str] = set()
    for term in terms:
        words = term.split()
        pattern = ""
        for index in range(len(words) - 1, -1, -1):
            rest = rf"(?:\s+(?:{pattern})?)?" if pattern else ""
            if index == 0 and not hold_first_word and pattern and len(words[0]) <= RELEASED_WORD_CHARS:
                pattern = re.escape(words[0]) + rf"\s+(?:{pattern})?"
            else:
                pattern = _word_prefix(words[index], rest)
        if pattern:
            alternatives.add(pattern)
    if not alternatives:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(sorted(alternatives)) + r")\Z", re.IGNORECASE)


_WORD_CHAR = re.compile(r"\w")
_SPACE_CHAR = re.compile(r"\s")


def word_before(text: str, pos: int) -> int:
    """Where the word and the whitespace just before ``pos`` begin (in
    ``re``'s classes): where a phrase whose first word was let out
    (:func:`term_prefixes`) may begin."""
    start = pos
    while start > 0 and _SPACE_CHAR.match(text, start - 1):
        start -= 1
    while start > 0 and _WORD_CHAR.match(text, start - 1):
        start -= 1
    return start


_CLASSES = (r"\w", r"\d", r"\s")
_RE_CLASSES = tuple(re.compile(c) for c in _CLASSES)
_REGEX_CLASSES = tuple(regex.compile(c) for c in _CLASSES)
_ASCII_UNALIKE = re.compile("[\x1c-\x1f]")  # whitespace to re, not to regex


@functools.lru_cache(maxsize=4096)
def _stand_in(char: str) -> str:
    """``char``, or when the engines classify it differently, a non-ASCII
    character both engines put in the classes ``re`` puts ``char`` in (so it
    matches no ASCII literal either)."""
    if char == "\u0131":
        return "i"  # re's case-insensitive matching takes the dotless i for i, regex's does not
    in_re = [p.match(char) is not None for p in _RE_CLASSES]
    if in_re == [p.match(char) is not None for p in _REGEX_CLASSES]:
        return char
    word, digit, space = in_re
    if digit:
        return "\u0660"  # ARABIC-INDIC DIGIT ZERO
    if word:
        return "\u0436"  # CYRILLIC SMALL LETTER ZHE
    return "\u2028" if space else "\u00b6"  # LINE SEPARATOR, PILCROW SIGN


def _stand_ins(text: str) -> dict[int, str]:
    if text.isascii() and _ASCII_UNALIKE.search(text) is None:
        return {}
    return {ord(char): stand_in for char in set(text) if (stand_in := _stand_in(char)) != char}


def proxied(text: str) -> str:
    """``text`` with the characters on which ``re`` and ``regex`` disagree
    replaced by stand-ins (:func:`_stand_in`), for patterns whose literals are
    ASCII: a ``regex`` search of it finds what an ``re`` search of ``text``
    would, plus at most matches that need a dotless i to be an ``i``."""
    table = _stand_ins(text)
    return text.translate(table) if table else text


def engines_agree(text: str) -> bool:
    """Whether ``re`` and ``regex`` classify every character of ``text``
    alike, so that any pattern searches it the same in both."""
    return not _stand_ins(text)


def partial_start(pattern: regex.Pattern[str], text: str, pos: int) -> int:
    """The earliest offset ``>= pos`` where ``pattern`` matches ``text`` or
    could match it extended; ``len(text)`` when nowhere."""
    match = pattern.search(text, pos, partial=True)
    return len(text) if match is None else match.start()
