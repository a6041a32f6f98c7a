"""The regular expressions a schema's ``pattern`` may use, parsed.

The subset is what strict-mode schemas and pydantic's ``constr(pattern=…)``
use: literals and escaped metacharacters, ``.``, classes (``[a-z0-9_]``,
``[^…]``), ``\\d \\w \\s`` and their negations, quantifiers (``? * + {m}
{m,} {m,n}``, lazy or not), groups (plain, ``(?:…)``, ``(?P<name>…)``),
alternation, and the anchors ``^`` at the start and ``$`` at the end of
the pattern or of one of its top-level alternatives. Anything else
(lookaround, backreferences, word boundaries, inline flags, possessive
quantifiers, atomic groups…) is refused by name with
:class:`engine.schema_subset.SchemaNotSupported`.

A pattern is parsed to :data:`Regex`, whose language is the set of strings
the pattern matches in full; each of them also satisfies JSON Schema's
unanchored match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmmesh.engine.schema_subset import SchemaNotSupported

SUBSET = "literals, '.', classes, \\d \\w \\s, quantifiers, groups, alternation, and ^ $ anchors"

DIGITS = ((ord("0"), ord("9")),)
WORD = ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("_"), ord("_")), (ord("a"), ord("z")))
SPACE = ((ord("\t"), ord("\r")), (ord(" "), ord(" ")))
NEWLINE = ((ord("\n"), ord("\n")),)
_CLASS_ESCAPES = {"d": DIGITS, "w": WORD, "s": SPACE}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_REFUSED_ESCAPES = {
    "b": "a word boundary",
    "B": "a word boundary",
    "A": "an anchor",
    "Z": "an anchor",
    "z": "an anchor",
    "G": "an anchor",
    "k": "a backreference",
    "p": "a Unicode property",
    "P": "a Unicode property",
    "N": "a named character",
}
_REFUSED_GROUPS = (
    ("(?=", "a lookahead"),
    ("(?!", "a lookahead"),
    ("(?<=", "a lookbehind"),
    ("(?<!", "a lookbehind"),
    ("(?P=", "a backreference"),
    ("(?>", "an atomic group"),
    ("(?#", "a comment"),
    ("(?(", "a conditional group"),
)
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


@dataclass(frozen=True)
class Chars:
    """One character: in ``ranges`` (inclusive code points), or with
    ``negated`` in none of them."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Sequence:
    items: tuple[Regex, ...]


@dataclass(frozen=True)
class Alternation:
    options: tuple[Regex, ...]


@dataclass(frozen=True)
class Repeat:
    """``item`` from ``least`` to ``most`` times (None: unbounded)."""

    item: Regex
    least: int
    most: int | None


Regex = Chars | Sequence | Alternation | Repeat


def parse_pattern(pattern: str, where: str) -> Regex:
    """Parse ``pattern``; raise :class:`SchemaNotSupported` naming what
    lies outside the subset, ``where`` saying whose pattern it is."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SchemaNotSupported(f"pattern at {where} is not a valid regular expression: {exc}") from exc
    return _Parser(pattern, where).parse()


class _Parser:
    def __init__(self, pattern: str, where: str) -> None:
        self.text = pattern
        self.where = where
        self.at = 0

    def refuse(self, what: str, token: str) -> SchemaNotSupported:
        return SchemaNotSupported(
            f"pattern at {self.where} uses {what} ({token!r} at offset {self.at}), "
            f"outside the supported subset: {SUBSET}"
        )

    def peek(self, ahead: int = 0) -> str:
        index = self.at + ahead
        return self.text[index] if index < len(self.text) else ""

    def parse(self) -> Regex:
        options = [self.sequence(top=True)]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence(top=True))
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def sequence(self, top: bool) -> Regex:
        items: list[Regex] = []
        if self.peek() == "^":
            if not top:
                raise self.refuse("an anchor inside a group", "^")
            self.at += 1
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "$":
                self.at += 1
                if not top or self.peek() not in ("", "|"):
                    raise self.refuse("an anchor before the end", "$")
                break
            if self.peek() == "^":
                raise self.refuse("an anchor after the start", "^")
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Sequence(tuple(items))

    def group(self) -> Regex:
        for opening, what in _REFUSED_GROUPS:
            if self.text.startswith(opening, self.at):
                raise self.refuse(what, opening)
        if self.text.startswith("(?:", self.at):
            self.at += 3
        elif self.text.startswith("(?P<", self.at):
            self.at = self.text.index(">", self.at) + 1
        elif self.text.startswith("(?", self.at):
            raise self.refuse("inline flags", self.text[self.at : self.at + 3])
        else:
            self.at += 1
        options = [self.sequence(top=False)]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence(top=False))
        self.at += 1  # ")": re.compile checked the nesting
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def atom(self) -> Regex:
        char = self.peek()
        if char == "(":
            return self.group()
        if char == "[":
            return self.char_class()
        self.at += 1
        if char == ".":
            return Chars(NEWLINE, negated=True)
        if char == "\\":
            return self.escape(in_class=False)
        return Chars(((ord(char), ord(char)),))

    def escape(self, in_class: bool) -> Chars:
        """The escape after a backslash (already read)."""
        char = self.peek()
        self.at += 1
        if char.lower() in _CLASS_ESCAPES:
            if char.isupper() and in_class:
                raise self.refuse("a negated escape inside a class", "\\" + char)
            return Chars(_CLASS_ESCAPES[char.lower()], negated=char.isupper())
        if char in _CONTROL_ESCAPES:
            code = ord(_CONTROL_ESCAPES[char])
        elif char in ("x", "u", "U"):
            digits = {"x": 2, "u": 4, "U": 8}[char]
            code = int(self.text[self.at : self.at + digits], 16)
            self.at += digits
        elif char in _REFUSED_ESCAPES:
            raise self.refuse(_REFUSED_ESCAPES[char], "\\" + char)
        elif char.isdigit():
            raise self.refuse("a backreference or octal escape", "\\" + char)
        elif char.isalnum():
            raise self.refuse("an unknown escape", "\\" + char)
        else:
            code = ord(char)
        return Chars(((code, code),))

    def char_class(self) -> Chars:
        self.at += 1
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while first or self.peek() != "]":
            first = False
            low = self.class_member()
            if isinstance(low, Chars):
                ranges.extend(low.ranges)
                continue
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.at += 1
                high = self.class_member()
                if isinstance(high, Chars):
                    raise self.refuse("a range ending in a class escape", self.text[self.at - 2 : self.at])
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        self.at += 1
        return Chars(tuple(sorted(ranges)), negated)

    def class_member(self) -> int | Chars:
        """One member of a class: a code point, or a class escape's ranges."""
        char = self.peek()
        self.at += 1
        if char == "[" and self.peek() in (":", "=", "."):
            raise self.refuse("a POSIX class", "[" + self.peek())
        if char != "\\":
            return ord(char)
        kind = self.peek()
        escaped = self.escape(in_class=True)
        return escaped if kind.lower() in _CLASS_ESCAPES else escaped.ranges[0][0]

    def quantified(self, item: Regex) -> Regex:
        char = self.peek()
        if char in ("?", "*", "+"):
            self.at += 1
            least, most = {"?": (0, 1), "*": (0, None), "+": (1, None)}[char]
        elif char == "{" and (match := _QUANTIFIER.match(self.text, self.at)):
            self.at = match.end()
            least = int(match.group(1))
            most = least if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
        else:
            return item
        if self.peek() == "?":
            self.at += 1  # lazy: the same strings
        elif self.peek() == "+":
            raise self.refuse("a possessive quantifier", self.text[self.at - 1 : self.at + 1])
        return Repeat(item, least, most)
