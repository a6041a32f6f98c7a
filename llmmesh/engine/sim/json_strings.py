"""Strings of the simulator's guided JSON that a ``format`` or ``pattern``
shapes.

A format value is plausible and drawn, not fixed: a date between 2000 and
2029, a time in UTC, a duration of days, hours, minutes and seconds, a
version 4 UUID, an ``example.com`` hostname or an email address at one,
words from the vocabulary where a name is needed, a public-looking IPv4
address, an IPv6 address in the documentation prefix. A pattern's string
follows the parsed expression (:mod:`engine.schema_pattern`), each
alternative, repetition count and character a draw; unbounded
repetitions repeat at most :data:`OPEN_REPEAT` times more than their least.
Characters come from printable ASCII where the expression allows it.
Length bounds steer the draws; a draw that still misses them is redrawn
up to :data:`ATTEMPTS` times before the schema is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmmesh.engine.schema_pattern import Alternation, Chars, Regex, Repeat, Sequence, parse_pattern
from llmmesh.engine.schema_subset import FORMATS, SchemaNotSupported
from llmmesh.engine.sim.vocabulary import WORDS

OPEN_REPEAT = 3
ATTEMPTS = 8
PRINTABLE = (0x20, 0x7E)
FIXED_LENGTHS = {"date": 10, "time": 9, "date-time": 20, "uuid": 36, "ipv6": 39}
NAME_WORDS = 200
"""Names in emails and hostnames are drawn from the most frequent words."""

Choose = Callable[[int], int]


@dataclass(frozen=True)
class StringNode:
    """A string: its length bounds, and a format or a parsed pattern."""

    min_length: int = 0
    max_length: int | None = None
    format: str | None = None
    pattern: str | None = None
    regex: Regex | None = None
    where: str = "#"


def string_node(schema: Mapping[str, object], where: str) -> StringNode:
    """The node of ``schema`` as a string; refuses what cannot be met."""
    min_length, max_length = schema.get("minLength", 0), schema.get("maxLength")
    for keyword, value in (("minLength", min_length), ("maxLength", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SchemaNotSupported(f"{keyword} at {where} must be a non-negative integer")
    assert isinstance(min_length, int) and (max_length is None or isinstance(max_length, int))
    if max_length is not None and max_length < min_length:
        raise SchemaNotSupported(f"minLength and maxLength at {where} allow no string")
    fmt, pattern = schema.get("format"), schema.get("pattern")
    if fmt is not None and fmt not in FORMATS:
        raise SchemaNotSupported(
            f"format {fmt!r} at {where} is not supported; supported: {', '.join(FORMATS)}"
        )
    if fmt is not None and pattern is not None:
        raise SchemaNotSupported(f"format and pattern together at {where} are not supported")
    if fmt in FIXED_LENGTHS and not _fits((FIXED_LENGTHS[str(fmt)],) * 2, min_length, max_length):
        raise SchemaNotSupported(f"format {fmt!r} at {where} has no value within minLength and maxLength")
    regex = None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise SchemaNotSupported(f"pattern at {where} must be a string")
        regex = parse_pattern(pattern, where)
        if not _fits(_span(regex), min_length, max_length):
            raise SchemaNotSupported(f"pattern at {where} matches no string within minLength and maxLength")
    return StringNode(min_length, max_length, None if fmt is None else str(fmt), pattern, regex, where)


def shaped_text(node: StringNode, choose: Choose) -> tuple[str, int]:
    """A string of a node with a format or pattern, unquoted, and how many
    equally likely strings it was drawn among."""
    for _ in range(ATTEMPTS):
        choices = _Choices(choose)
        if node.regex is not None:
            text = _text(node.regex, node.min_length, node.max_length, choices)
            matches = node.pattern is not None and re.search(node.pattern, text) is not None
        else:
            text, matches = _FORMATS[str(node.format)](choices), True
        if matches and _fits((len(text), len(text)), node.min_length, node.max_length):
            return text, choices.count
    what = f"format {node.format!r}" if node.format is not None else f"pattern {node.pattern!r}"
    raise SchemaNotSupported(f"no string of {what} at {node.where} within minLength and maxLength was found")


class _Choices:
    """Draws, counting the alternatives they chose among."""

    def __init__(self, choose: Choose) -> None:
        self._choose = choose
        self.count = 1

    def pick(self, count: int) -> int:
        if count <= 1:
            return 0
        self.count *= count
        return self._choose(count)

    def number(self, low: int, high: int) -> int:
        return low + self.pick(high - low + 1)

    def word(self) -> str:
        return WORDS[self.pick(NAME_WORDS)]


def _fits(span: tuple[int, int | None], low: int, high: int | None) -> bool:
    shortest, longest = span
    return (high is None or shortest <= high) and (longest is None or longest >= low)


def _span(node: Regex) -> tuple[int, int | None]:
    """The shortest and longest (None: unbounded) strings of ``node``."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Sequence | Alternation):
        spans = [_span(item) for item in (node.items if isinstance(node, Sequence) else node.options)]
        longest = [span[1] for span in spans]
        if isinstance(node, Alternation):
            return min(s[0] for s in spans), None if None in longest else max(x or 0 for x in longest)
        return sum(s[0] for s in spans), None if None in longest else sum(x or 0 for x in longest)
    shortest, longest_item = _span(node.item)
    if longest_item == 0 or node.most == 0:
        return 0, 0
    if node.most is None or longest_item is None:
        return node.least * shortest, None
    return node.least * shortest, node.most * longest_item


def _text(node: Regex, low: int, high: int | None, choices: _Choices) -> str:
    """A string of ``node``, its length steered into [low, high]."""
    if isinstance(node, Chars):
        return _char(node, choices)
    if isinstance(node, Alternation):
        fitting = [option for option in node.options if _fits(_span(option), low, high)] or list(node.options)
        return _text(fitting[choices.pick(len(fitting))], low, high, choices)
    items = node.items if isinstance(node, Sequence) else ()
    if isinstance(node, Repeat):
        items = (node.item,) * _repeat_count(node, low, high, choices)
    spans = [_span(item) for item in items]
    parts: list[str] = []
    used = 0
    for i, item in enumerate(items):
        rest = spans[i + 1 :]
        rest_longest = [span[1] for span in rest]
        item_high = None if high is None else high - used - sum(span[0] for span in rest)
        item_low = 0 if None in rest_longest else max(0, low - used - sum(x or 0 for x in rest_longest))
        parts.append(_text(item, item_low, item_high, choices))
        used += len(parts[-1])
    return "".join(parts)


def _repeat_count(node: Repeat, low: int, high: int | None, choices: _Choices) -> int:
    shortest, longest = _span(node.item)
    least = node.least
    most = node.most if node.most is not None else node.least + OPEN_REPEAT
    if longest and low > 0:
        least = max(least, math.ceil(low / longest))
        if node.most is None:
            most = max(most, least)
        least = min(least, most)
    if high is not None and shortest > 0:
        most = max(min(most, high // shortest), node.least)
    return choices.number(least, max(least, most))


def _char(node: Chars, choices: _Choices) -> str:
    def inside(code: int) -> bool:
        return any(low <= code <= high for low, high in node.ranges)

    if node.negated:
        pool = [code for code in range(PRINTABLE[0], PRINTABLE[1] + 1) if not inside(code)]
        if not pool:
            pool = [code for code in range(0xA1, 0x250) if not inside(code)]
        return chr(pool[choices.pick(len(pool))])
    printable = [
        (max(low, PRINTABLE[0]), min(high, PRINTABLE[1]))
        for low, high in node.ranges
        if low <= PRINTABLE[1] and high >= PRINTABLE[0]
    ]
    ranges = printable or [(low, high) for low, high in node.ranges if high < 0xD800 or low > 0xDFFF]
    index = choices.pick(sum(high - low + 1 for low, high in ranges))
    for low, high in ranges:
        if index <= high - low:
            return chr(low + index)
        index -= high - low + 1
    raise SchemaNotSupported("a character class allows no character")  # pragma: no cover


def _date(choices: _Choices) -> str:
    return f"{choices.number(2000, 2029):04d}-{choices.number(1, 12):02d}-{choices.number(1, 28):02d}"


def _time(choices: _Choices) -> str:
    return f"{choices.number(0, 23):02d}:{choices.number(0, 59):02d}:{choices.number(0, 59):02d}Z"


def _duration(choices: _Choices) -> str:
    return (
        f"P{choices.number(0, 30)}DT{choices.number(0, 23)}H{choices.number(0, 59)}M{choices.number(0, 59)}S"
    )


def _uuid(choices: _Choices) -> str:
    digits = [f"{choices.pick(16):x}" for _ in range(30)]
    hexes = (
        "".join(digits[:12]) + "4" + "".join(digits[12:15]) + "89ab"[choices.pick(4)] + "".join(digits[15:])
    )
    return f"{hexes[:8]}-{hexes[8:12]}-{hexes[12:16]}-{hexes[16:20]}-{hexes[20:]}"


def _hostname(choices: _Choices) -> str:
    return f"{choices.word()}-{choices.word()}.example.com"


def _email(choices: _Choices) -> str:
    return f"{choices.word()}.{choices.word()}@{choices.word()}.example.com"


def _ipv4(choices: _Choices) -> str:
    return ".".join(
        str(part) for part in (choices.number(1, 223), *(choices.number(0, 255) for _ in range(3)))
    )


def _ipv6(choices: _Choices) -> str:
    groups = (f"{choices.pick(65536):04x}" for _ in range(6))
    return "2001:0db8:" + ":".join(groups)


_FORMATS: dict[str, Callable[[_Choices], str]] = {
    "date": _date,
    "time": _time,
    "date-time": lambda choices: f"{_date(choices)}T{_time(choices)}",
    "duration": _duration,
    "uuid": _uuid,
    "hostname": _hostname,
    "email": _email,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
}
