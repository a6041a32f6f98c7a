"""Numbers and integers of the simulator's guided JSON.

A number node keeps its schema's bounds (``minimum``/``maximum`` closed,
``exclusiveMinimum``/``exclusiveMaximum`` open, the tighter one of each
side) and ``multipleOf``. A value is one of at most :data:`POINTS` evenly
spaced candidates in the range: integers (multiples of ``multipleOf``'s
numerator for an integer, since an integer multiple of p/q is a multiple
of p), exact decimal multiples of ``multipleOf`` for a number, or two-decimal
points for a number without it. A range the schema leaves open on a side
spans :data:`NUMBER_SPAN` steps (of 1, or of the multiple) from the other
bound, or from 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from llmmesh.engine.schema_subset import SchemaNotSupported

POINTS = 101
NUMBER_SPAN = 100
MULTIPLE_SCAN = 50
"""How many neighbouring multiples are tried for one that also divides in
binary floating point, as JSON Schema validators check ``multipleOf``."""


@dataclass(frozen=True)
class NumberNode:
    """An ``integer`` or ``number``; open bounds exclude their value."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    multiple_of: float | None = None


def number_node(schema: Mapping[str, object], kind: str, where: str) -> NumberNode:
    """The node of ``schema`` as ``kind``; refuses bounds that allow no value."""
    bounds: dict[str, float] = {}
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        value = schema.get(keyword)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SchemaNotSupported(f"{keyword} at {where} must be a finite number")
        bounds[keyword] = float(value)
    if bounds.get("multipleOf", 1.0) <= 0:
        raise SchemaNotSupported(f"multipleOf at {where} must be greater than 0")
    low, low_open = _tighter(bounds.get("minimum"), bounds.get("exclusiveMinimum"), max)
    high, high_open = _tighter(bounds.get("maximum"), bounds.get("exclusiveMaximum"), min)
    node = NumberNode(kind, low, high, low_open, high_open, bounds.get("multipleOf"))
    if low is not None and high is not None and not _allows_some(node):
        raise SchemaNotSupported(
            f"the bounds at {where} allow no {'integer' if kind == 'integer' else 'number'}"
        )
    return node


def _allows_some(node: NumberNode) -> bool:
    if node.kind == "integer" or node.multiple_of is not None:
        return _count(node)[1] > 0
    assert node.low is not None and node.high is not None
    return node.low < node.high or (node.low == node.high and not node.low_open and not node.high_open)


def _tighter(
    closed: float | None, opened: float | None, pick: Callable[[float, float], float]
) -> tuple[float | None, bool]:
    if opened is None:
        return closed, False
    if closed is None or pick(closed, opened) == opened:
        return opened, True
    return closed, False


def number_text(node: NumberNode, choose: Callable[[int], int]) -> tuple[str, int]:
    """One value of ``node`` as JSON text, and how many it was drawn among."""
    if node.kind == "number" and node.multiple_of is None:
        return _decimal_point(node, choose)
    (first, count), unit = _count(node), _unit(node)
    points = min(count, POINTS)
    index = choose(points)
    k = first + (index if count <= POINTS else round(index * (count - 1) / (POINTS - 1)))
    if node.multiple_of is not None and node.kind == "number":
        for step in range(MULTIPLE_SCAN):
            for candidate in (k + step, k - step):
                if first <= candidate < first + count and _divides(candidate * unit, node.multiple_of):
                    return _decimal(candidate * unit), points
    return _decimal(k * unit), points


def _unit(node: NumberNode) -> Fraction:
    if node.multiple_of is None:
        return Fraction(1)
    multiple = Fraction(repr(node.multiple_of))
    return Fraction(multiple.numerator) if node.kind == "integer" else multiple


def _range(node: NumberNode, unit: Fraction) -> tuple[Fraction, Fraction, bool, bool]:
    """The node's range, a side the schema leaves open spanning
    :data:`NUMBER_SPAN` units (closed) from the other side or from 0."""
    span = unit * NUMBER_SPAN
    low = None if node.low is None else Fraction(node.low)
    high = None if node.high is None else Fraction(node.high)
    if low is None and high is None:
        return Fraction(0), span, False, False
    if low is None:
        assert high is not None
        return high - span, high, False, node.high_open
    if high is None:
        return low, low + span, node.low_open, False
    return low, high, node.low_open, node.high_open


def _count(node: NumberNode) -> tuple[int, int]:
    """The first multiple ``k`` (of the unit) in range, and how many there are."""
    unit = _unit(node)
    low, high, low_open, high_open = _range(node, unit)
    first = math.floor(low / unit) + 1 if low_open else math.ceil(low / unit)
    last = math.ceil(high / unit) - 1 if high_open else math.floor(high / unit)
    return first, last - first + 1


def _decimal(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return format(Decimal(value.numerator) / Decimal(value.denominator), "f")


def _divides(value: Fraction, multiple: float) -> bool:
    quotient = float(value) / multiple
    return int(quotient) == quotient


def _decimal_point(node: NumberNode, choose: Callable[[int], int]) -> tuple[str, int]:
    exact_low, exact_high, low_open, high_open = _range(node, Fraction(1))
    low, high = float(exact_low), float(exact_high)

    def inside(value: float) -> bool:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        return above and below

    first, last = (1 if low_open else 0), (POINTS - 2 if high_open else POINTS - 1)
    index = first + choose(last - first + 1)
    exact = low + (high - low) * index / (POINTS - 1)
    for value in (round(exact, 2), exact, (low + high) / 2, math.nextafter(low, high)):
        if inside(value):
            return json.dumps(value), last - first + 1
    raise SchemaNotSupported("the bounds allow no number")
