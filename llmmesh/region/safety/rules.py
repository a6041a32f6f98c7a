""":class:`RulesBackend`: deny lists, regexes and PII detectors; no network.

Deliberately crude and cheap: it runs on every streamed window. Deny-list
terms match whole words only (case-insensitive, any run of whitespace between
the words of a phrase), so a term never matches inside a longer word (the
Scunthorpe problem). Payment card numbers are confirmed with the Luhn check so
that arbitrary digit runs (order ids, timestamps) are not reported.

:meth:`RulesBackend.hold_from` tells exactly where, in a reply still
streaming, any of these could yet match (see :mod:`region.safety.partial`).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import regex

from llmmesh.region.safety import verdict as cat
from llmmesh.region.safety.backend import SafetyBackend
from llmmesh.region.safety.partial import (
    RELEASED_WORD_CHARS,
    Normalised,
    engines_agree,
    normalise,
    partial_start,
    proxied,
    settled_end,
    term_prefixes,
    word_before,
)
from llmmesh.region.safety.prefilter import TermWords, lowered_if_ascii, needs_of
from llmmesh.region.safety.verdict import CheckKind, Verdict, require_categories

# A small, conservative starting point per category; deployments extend it
# from configuration. Phrases, not single words, to keep false positives rare.
BUILTIN_DENY_TERMS: Mapping[str, tuple[str, ...]] = {
    cat.HARASSMENT: ("you are worthless", "nobody will ever love you", "you pathetic loser"),
    cat.HARASSMENT_THREATENING: ("i know where you live", "i will find you and hurt you"),
    cat.HATE: ("subhuman vermin", "inferior race", "racial purity"),
    cat.HATE_THREATENING: ("exterminate them all", "they should all be exterminated"),
    cat.ILLICIT: ("buy stolen credit cards", "launder the money", "cook meth"),
    cat.ILLICIT_VIOLENT: ("build a pipe bomb", "make a pipe bomb", "untraceable ghost gun"),
    cat.SELF_HARM: ("i cut myself", "i keep hurting myself"),
    cat.SELF_HARM_INTENT: ("i want to kill myself", "i want to end my life"),
    cat.SELF_HARM_INSTRUCTIONS: ("painless way to kill yourself", "how to kill yourself"),
    cat.SEXUAL: ("explicit sex scene", "hardcore porn"),
    cat.SEXUAL_MINORS: ("child sexual abuse material", "child porn"),
    cat.VIOLENCE: ("beat him to death", "stab them in the throat"),
    cat.VIOLENCE_GRAPHIC: ("disembowel", "spilling his intestines"),
}

# Markers of attempts to override the system's instructions. Input only: a
# model explaining prompt injection is not an attack.
INJECTION_PATTERNS: tuple[str, ...] = (
    r"\b(?:ignore|disregard|forget)\s+(?:all\s+|any\s+)?(?:(?:the|your|my)\s+)?"
    r"(?:previous|prior|above|earlier|preceding)\s+(?:instructions|prompts?|rules|directions)\b",
    r"\byou\s+are\s+now\s+(?:DAN|in\s+developer\s+mode|jailbroken|unfiltered)\b",
    r"\bsystem\s+prompt\s*:",
    r"\b(?:reveal|print|show|repeat)\s+(?:me\s+)?(?:your|the)\s+(?:system\s+prompt|hidden\s+instructions)\b",
    r"<\|im_start\|>\s*system",
    r"\bdeveloper\s+mode\s+enabled\b",
)

# Digits separated by at most one space or dash: a candidate card number.
_DIGIT_RUN = re.compile(r"\d(?:[ -]?\d)*")
_GROUP_SEP = re.compile(r"[ -]")
# A digit run next to these is part of something longer (a card, an id).
_NOT_AFTER_DIGITS = r"(?<![\w+])(?<!\d[ .-])"
_NOT_BEFORE_DIGITS = r"(?!\w)(?![ .-]\d)"
_ANY_DIGIT = re.compile(r"\d")
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}(?!\w)")
# An email address from its "@" on: what the output filter holds of one (see RulesBackend.hold_from).
_EMAIL_FROM_AT = re.compile(r"(?<=[\w.+-])@[\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}(?!\w)")
_PHONES = (
    re.compile(
        _NOT_AFTER_DIGITS
        + r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}"
        + _NOT_BEFORE_DIGITS
    ),
    re.compile(r"(?<![\w+])\+\d{8,15}(?!\d)"),  # E.164 without separators
)
_NATIONAL_IDS = (
    # US social security number (the area numbers never issued excluded).
    re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])"),
    # UK National Insurance number; upper case only, as it is written.
    re.compile(r"\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"),
)
OFFLOAD_CHARS = 16_384
"""Texts longer than this are classified on a worker thread."""
_CONTEXT_CHARS = 16
"""Released characters :meth:`RulesBackend.hold_from` reads before ``since``,
for the rules' look-behinds (none looks back more than two characters)."""
_CARD_DIGITS = range(13, 20)

_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # Luhn: 2d, minus 9 when over 9


def luhn_valid(digits: str) -> bool:
    """Whether a string of decimal digits passes the Luhn (mod 10) check."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        total += _DOUBLED[int(char)] if position % 2 else int(char)
    return total % 10 == 0


def _card_span(groups: Sequence[str]) -> int | None:
    """The first group of the earliest span of whole ``groups`` (a card may sit
    next to more digits, such as a CVV) that is a card number, if one is.

    Each span's Luhn sum comes from prefix sums in O(1), so a long run costs
    linear time, not quadratic.
    """
    digits = "".join(groups)
    if len(digits) in _CARD_DIGITS and luhn_valid(digits):
        return 0
    if len(groups) == 1:
        return None
    # odd_doubled[i]: Luhn sum of digits[:i] doubling odd positions; the
    # right for a span whose last digit sits at an even position.
    odd_doubled, even_doubled = [0], [0]
    for position, char in enumerate(digits):
        value, doubled = int(char), _DOUBLED[int(char)]
        odd_doubled.append(odd_doubled[-1] + (doubled if position % 2 else value))
        even_doubled.append(even_doubled[-1] + (value if position % 2 else doubled))
    offsets = list(itertools.accumulate((len(g) for g in groups), initial=0))
    for first, start in enumerate(offsets):
        low = bisect.bisect_left(offsets, start + _CARD_DIGITS.start, first + 1)
        high = bisect.bisect_right(offsets, start + _CARD_DIGITS.stop - 1, first + 1)
        for end in offsets[low:high]:
            sums = odd_doubled if (end - 1) % 2 == 0 else even_doubled
            if (sums[end] - sums[start]) % 10 == 0:
                return first
    return None


def contains_card_number(text: str) -> bool:
    """Whether ``text`` holds a 13-19 digit, Luhn-valid payment card number."""
    return any(_card_span(_GROUP_SEP.split(match.group())) is not None for match in _DIGIT_RUN.finditer(text))


def card_hold(text: str, pos: int = 0) -> int:
    """The earliest offset ``>= pos`` where a card number starts in ``text``
    or could start, digits still to come completing it; ``len(text)`` when
    none can.

    Digits at the end (or followed by one space or dash) can grow into a card
    from any group start with fewer digits after it than a card has: the
    last digit to come can always make the Luhn sum right.
    """
    for run in _DIGIT_RUN.finditer(text, pos):
        groups = _GROUP_SEP.split(run.group())
        starts = list(itertools.accumulate((len(g) + 1 for g in groups), initial=run.start()))
        first = _card_span(groups)
        if first is not None:
            return starts[first]
        if run.end() == len(text) or (run.end() == len(text) - 1 and text[-1] in " -"):
            remaining = sum(map(len, groups))
            for start, group in zip(starts, groups, strict=False):
                if remaining < _CARD_DIGITS.stop - 1:
                    return start
                remaining -= len(group)
    return len(text)


def _any_term_pattern(terms: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern that matches wherever any of ``terms`` matches as
    :func:`_term_pattern` matches it (whole words, case-insensitive, any run
    of whitespace between words), for one search instead of one per category.

    The terms share one trie of alternatives, so at a word start the search
    tries each distinct first letter once rather than every term: a clean
    window, the common case, costs a fraction of the per-category searches.
    """
    root: dict[str, dict[str, Any]] = {}
    for term in terms:
        node = root
        for word_index, word in enumerate(term.split()):
            for token in ([r"\s+"] if word_index else []) + [re.escape(char) for char in word]:
                node = node.setdefault(token, {})
        if node is not root:
            node[""] = {}  # a term ends here

    def alternatives(node: dict[str, Any]) -> str:
        branches = [token + alternatives(child) for token, child in node.items() if token]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    if not root:
        return None
    return re.compile(r"(?<!\w)(?:" + alternatives(root) + r")(?!\w)", re.IGNORECASE)


def _term_pattern(terms: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = sorted(
        {r"\s+".join(re.escape(word) for word in term.split()) for term in terms if term.strip()},
        key=len,
        reverse=True,
    )
    if not alternatives:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)", re.IGNORECASE)


def _partial(*patterns: re.Pattern[str]) -> regex.Pattern[str]:
    """Any of ``patterns`` (flags alike, no numbered groups) in the engine
    that matches partially: one search finds the earliest start of them all."""
    (flags,) = {pattern.flags & re.IGNORECASE for pattern in patterns}
    source = "|".join(f"(?:{pattern.pattern})" for pattern in patterns)
    return regex.compile(source, regex.IGNORECASE if flags else 0)


class RulesBackend(SafetyBackend):
    """Deny lists, regexes, PII and prompt-injection markers.

    ``deny_terms`` and ``patterns`` (regexes) extend the built-in rules per
    category; ``builtin=False`` drops the built-in deny terms. Categories in
    ``report_only`` are reported in the verdict but never block.

    ``hold_first_word=False`` lets a streamed reply's word out even where it
    is the first word of a deny-listed phrase of two or more words (see
    :func:`region.safety.partial.term_prefixes`): the phrase is held from
    its second word, so a reply beginning "You" or "I" is not held a decode
    step for "you are worthless" or "i want to kill myself", and a flagged
    phrase never reaches the client past its first word. With it (the
    default here) no part of a phrase is let out.
    """

    def __init__(
        self,
        *,
        deny_terms: Mapping[str, Iterable[str]] | None = None,
        patterns: Mapping[str, Iterable[str]] | None = None,
        report_only: Collection[str] = (),
        builtin: bool = True,
        name: str = "rules",
        hold_first_word: bool = True,
    ) -> None:
        self.name = name
        self.hold_first_word = hold_first_word
        self._report_only = frozenset(require_categories(report_only))
        terms: dict[str, list[str]] = {
            c: list(BUILTIN_DENY_TERMS.get(c, ())) if builtin else [] for c in cat.ALL_CATEGORIES
        }
        for category, extra in (deny_terms or {}).items():
            terms[require_categories([category])[0]].extend(extra)
        self._terms: list[tuple[str, re.Pattern[str]]] = []
        for category, listed in terms.items():
            pattern = _term_pattern(listed)
            if pattern is not None:
                self._terms.append((category, pattern))
        all_terms = [term for listed in terms.values() for term in listed]
        self._any_term = _any_term_pattern(all_terms)
        # What a text needs for a term to match, tested before the search (see prefilter).
        self._any_term_needs = TermWords.of(all_terms)
        self._patterns: list[tuple[str, re.Pattern[str]]] = [
            (require_categories([category])[0], re.compile(source, re.IGNORECASE))
            for category, sources in (patterns or {}).items()
            for source in sources
        ]
        self._injection = [re.compile(p, re.IGNORECASE) for p in INJECTION_PATTERNS]
        self._pattern_needs = [needs_of(pattern) for _, pattern in self._patterns]
        self._injection_needs = [needs_of(pattern) for pattern in self._injection]
        self._clean = Verdict.safe(self.name)
        self._init_holds(terms)

    def _init_holds(self, terms: Mapping[str, Sequence[str]]) -> None:
        """What :meth:`hold_from` searches: blocking categories only, since a
        report-only one never stops a reply."""
        blocking = [t for category, listed in terms.items() if self._blocks(category) for t in listed]
        self._whole_terms = _term_pattern(blocking)
        self._term_prefixes = term_prefixes(blocking, hold_first_word=self.hold_first_word)
        self._held_pii = _partial(_EMAIL_FROM_AT, *_PHONES, *_NATIONAL_IDS) if self._blocks(cat.PII) else None
        self._held_injection = _partial(*self._injection) if self._blocks(cat.PROMPT_INJECTION) else None
        # What _held_in searches, per kind: the patterns that exist, built once.
        self._held_terms = tuple(t for t in (self._term_prefixes, self._whole_terms) if t is not None)
        pii = () if self._held_pii is None else (self._held_pii,)
        injection = () if self._held_injection is None else (self._held_injection,)
        self._held_partial: dict[str, tuple[regex.Pattern[str], ...]] = {
            "output": pii,
            "input": pii + injection,
        }
        self._held_patterns: list[regex.Pattern[str]] | None
        try:
            self._held_patterns = [_partial(p) for c, p in self._patterns if self._blocks(c)]
        except regex.error:
            self._held_patterns = None  # re accepts what regex does not: cannot tell
        # A mark still to come can turn an ASCII letter into another one (e
        # into é); that can make a rule match only where a term holds such a
        # letter or a configured pattern might (an ASCII term's prefix is held
        # anyway, and a composed letter never makes a built-in pattern match).
        self._ascii_settles = not self._held_patterns and all(term.isascii() for term in blocking)
        # Configured patterns may look back any distance; the built-in rules and
        # terms a few characters, and a phrase whose first word was let out that word.
        self._look_back = _CONTEXT_CHARS + (0 if self.hold_first_word else RELEASED_WORD_CHARS)
        self.context_chars = None if self._patterns else self._look_back

    def _blocks(self, category: str) -> bool:
        return category not in self._report_only

    async def check(self, text: str, *, kind: CheckKind) -> Verdict:
        if len(text) > OFFLOAD_CHARS:
            # About a second per megabyte: keep the event loop serving meanwhile.
            return await asyncio.to_thread(self.classify, text, kind=kind)
        return self.classify(text, kind=kind)

    def check_at_once(self, text: str, *, kind: CheckKind) -> Verdict | None:
        """:meth:`classify` for a text short enough to classify on the event loop."""
        return self.classify(text, kind=kind) if len(text) <= OFFLOAD_CHARS else None

    def classify(self, text: str, *, kind: CheckKind) -> Verdict:
        """The same decision as :meth:`check`, synchronously."""
        normal = normalise(text)
        # Lower-cased where a rule's needs may be tested (ASCII text): a rule
        # whose needs it does not meet cannot match, and is not searched.
        lowered = lowered_if_ascii(normal)
        findings: dict[str, str] = {}
        # Which categories only when some term matches at all: most windows hold none.
        if (
            self._any_term is not None
            and (lowered is None or self._any_term_needs is None or self._any_term_needs.met_by(lowered))
            and self._any_term.search(normal)
        ):
            for category, pattern in self._terms:
                if pattern.search(normal):
                    findings.setdefault(category, "deny-listed term")
        for (category, pattern), needs in zip(self._patterns, self._pattern_needs, strict=True):
            if (lowered is None or needs.met_by(lowered)) and pattern.search(normal):
                findings.setdefault(category, "configured pattern")
        pii = self._pii(normal)
        if pii:
            findings.setdefault(cat.PII, pii)
        if kind == "input" and any(
            (lowered is None or needs.met_by(lowered)) and pattern.search(normal)
            for pattern, needs in zip(self._injection, self._injection_needs, strict=True)
        ):
            findings.setdefault(cat.PROMPT_INJECTION, "prompt-injection marker")
        if not findings:
            return self._clean
        reason = "; ".join(f"{what} ({category})" for category, what in findings.items())
        return Verdict.of(findings, report_only=self._report_only, reason=reason, backend=self.name)

    @staticmethod
    def _pii(text: str) -> str:
        # Every detector but the email's needs a digit, and the email's an @:
        # most text has neither and costs two scans, not seven searches.
        digits = _ANY_DIGIT.search(text) is not None
        if digits and contains_card_number(text):
            return "payment card number"
        if "@" in text and _EMAIL.search(text):
            return "email address"
        if digits and any(p.search(text) for p in _PHONES):
            return "phone number"
        if digits and any(p.search(text) for p in _NATIONAL_IDS):
            return "national id number"
        return ""

    def hold_from(self, text: str, *, kind: CheckKind, since: int = 0) -> int | None:
        """Exact for the deny list, card numbers and the built-in patterns:
        the earliest start of a whole-word, case- and whitespace-insensitive
        term prefix at the end (in the normal form :meth:`classify` matches),
        of a digit run that could still grow into a Luhn-valid card, or of a
        partial PII (and, for input, injection) pattern match. An email
        address is held from its ``@``: a word is no address until one
        follows it, so the word before it may be out when the address is
        found, never the ``@`` and the domain. ``None`` for
        text that does not normalise character by character, and for a
        configured pattern the partial matcher cannot read as ``re`` does.
        """
        if self._held_patterns is None:
            return None
        since = min(max(0, since), len(text))
        # Configured patterns may look back any distance; the built-in ones
        # need only a little context before since.
        start = 0 if self._held_patterns else max(0, since - self._look_back)
        normal = Normalised.of(text[start:])
        if normal is None:
            return None
        found = self._held_in(normal.text, normal.to_normal(since - start), kind)
        if found is None:
            return None
        settled = len(text) if self._ascii_settles and text[-1:].isascii() else settled_end(text)
        hold = min(start + normal.to_original(found), settled)
        if since < settled < len(text):
            # The end may still become another letter (``cafe`` then a mark
            # makes ``café``): a match may begin before it, in what precedes
            # it followed by whatever it becomes.
            before = self.hold_from(text[:settled], kind=kind, since=since)
            if before is None:
                return None
            hold = min(hold, before)
        return max(since, hold)

    def _held_in(self, seen: str, pos: int, kind: CheckKind) -> int | None:
        """:meth:`hold_from` in normal form, from ``pos`` on."""
        starts = [len(seen)]
        # A phrase whose first word was let out begins at the word before pos.
        terms_from = pos if self.hold_first_word else word_before(seen, pos)
        for terms in self._held_terms:
            match = terms.search(seen, terms_from)
            if match is not None:
                starts.append(match.start())
        if self._held_pii is not None:
            starts.append(card_hold(seen, pos))
        partial = self._held_partial[kind]
        if partial:
            stood_in = proxied(seen)
            starts.extend(partial_start(p, stood_in, pos) for p in partial)
        if self._held_patterns:
            if not engines_agree(seen):
                return None
            starts.extend(partial_start(p, seen, pos) for p in self._held_patterns)
        return min(starts)
