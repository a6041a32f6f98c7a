"""The JSON Schema subset the simulator's guided decoding follows.

The subset is what OpenAI's strict structured outputs allow: ``type``
(``object``, ``array``, ``string``, ``number``, ``integer``, ``boolean``,
``null``, or a list of them, which is how a nullable field is written),
``properties``, ``required``, ``additionalProperties``, ``items``,
``minItems``/``maxItems``, ``minimum``/``maximum``, ``enum``, ``const``,
``anyOf``, and ``$ref`` to ``#``, ``#/$defs/…`` or ``#/definitions/…``.
Annotations (``description``, ``title``, ``default``, ``examples``,
``$schema``, ``$id``, ``$comment``) are allowed and have no effect. Any
other keyword (``pattern``, ``format``, ``oneOf``, ``allOf``, ``not``,
``exclusiveMinimum``…) is refused with :class:`SchemaNotSupported`: the
simulator cannot promise output valid against it, and never drops it.
Generated objects never carry properties beyond ``properties``, which every
``additionalProperties`` setting allows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$schema", "$id", "$comment"})
HANDLED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "definitions",
    }
)


class SchemaNotSupported(ValueError):
    """The schema uses something outside the supported subset, or is malformed."""


@dataclass(frozen=True)
class ObjectNode:
    """An object: ``properties`` in order, ``required`` among them."""

    properties: tuple[tuple[str, Node], ...]
    required: frozenset[str]


@dataclass(frozen=True)
class ArrayNode:
    items: Node
    min_items: int = 0
    max_items: int | None = None


@dataclass(frozen=True)
class ScalarNode:
    """A string, number, integer, boolean or null; bounds for numbers."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class EnumNode:
    """One of fixed JSON values (``enum``, or ``const`` as one value)."""

    values: tuple[object, ...]


@dataclass(frozen=True)
class AnyOfNode:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class RefNode:
    """A reference, resolved in :attr:`CompiledSchema.definitions`."""

    target: str


@dataclass(frozen=True)
class FreeObjectNode:
    """Any JSON object (``response_format`` json_object)."""


Node = ObjectNode | ArrayNode | ScalarNode | EnumNode | AnyOfNode | RefNode | FreeObjectNode


@dataclass(frozen=True)
class CompiledSchema:
    """A schema's root node and its named definitions (``#`` is the root)."""

    root: Node
    definitions: Mapping[str, Node]


def compile_schema(schema: Mapping[str, object]) -> CompiledSchema:
    """Compile ``schema``; raise :class:`SchemaNotSupported` naming the
    offending keyword and where it is."""
    definitions: dict[str, Node] = {}
    references: list[tuple[str, str]] = []
    for section in ("$defs", "definitions"):
        defs = schema.get(section, {})
        if not isinstance(defs, Mapping):
            raise SchemaNotSupported(f"{section} must be an object")
        for name, sub in defs.items():
            definitions[f"#/{section}/{name}"] = _compile(sub, f"#/{section}/{name}", references)
    root = _compile(schema, "#", references)
    definitions["#"] = root
    for target, where in references:
        if target not in definitions:
            raise SchemaNotSupported(f"$ref {target!r} at {where} names no definition")
    return CompiledSchema(root, definitions)


def _compile(schema: object, where: str, references: list[tuple[str, str]]) -> Node:
    if not isinstance(schema, Mapping):
        raise SchemaNotSupported(f"the schema at {where} is not an object")
    unknown = sorted(set(schema) - HANDLED - ANNOTATIONS)
    if unknown:
        raise SchemaNotSupported(f"keyword {unknown[0]!r} at {where} is not supported")
    if where != "#" and ("$defs" in schema or "definitions" in schema):
        raise SchemaNotSupported(f"definitions at {where} are supported only at the root")
    if "$ref" in schema:
        target = schema["$ref"]
        if not isinstance(target, str) or not (
            target == "#" or target.startswith(("#/$defs/", "#/definitions/"))
        ):
            raise SchemaNotSupported(f"$ref at {where} must be '#', '#/$defs/…' or '#/definitions/…'")
        if set(schema) - {"$ref", "$defs", "definitions"} - ANNOTATIONS:
            raise SchemaNotSupported(f"$ref at {where} has sibling keywords")
        references.append((target, where))
        return RefNode(target)
    if "const" in schema:
        return EnumNode((schema["const"],))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaNotSupported(f"enum at {where} must be a non-empty list")
        return EnumNode(tuple(values))
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise SchemaNotSupported(f"anyOf at {where} must be a non-empty list")
        return AnyOfNode(
            tuple(_compile(option, f"{where}/anyOf/{i}", references) for i, option in enumerate(options))
        )
    kinds = schema.get("type")
    if kinds is None:
        kinds = "object" if "properties" in schema else "array" if "items" in schema else "string"
    listed = kinds if isinstance(kinds, list) else [kinds]
    if not listed or any(kind not in TYPES for kind in listed):
        raise SchemaNotSupported(f"type at {where} must be one of {', '.join(TYPES)} or a list of them")
    nodes = [_typed(schema, str(kind), where, references) for kind in listed]
    return nodes[0] if len(nodes) == 1 else AnyOfNode(tuple(nodes))


def _typed(schema: Mapping[str, object], kind: str, where: str, references: list[tuple[str, str]]) -> Node:
    if kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, Mapping) or not isinstance(required, list):
            raise SchemaNotSupported(f"properties at {where} must be an object and required a list")
        missing = [name for name in required if name not in properties]
        if missing:
            raise SchemaNotSupported(f"required property {missing[0]!r} at {where} is not in properties")
        return ObjectNode(
            tuple(
                (str(name), _compile(sub, f"{where}/properties/{name}", references))
                for name, sub in properties.items()
            ),
            frozenset(str(name) for name in required),
        )
    if kind == "array":
        min_items, max_items = schema.get("minItems", 0), schema.get("maxItems")
        if not isinstance(min_items, int) or not (max_items is None or isinstance(max_items, int)):
            raise SchemaNotSupported(f"minItems and maxItems at {where} must be integers")
        if min_items < 0 or (max_items is not None and max_items < min_items):
            raise SchemaNotSupported(f"minItems and maxItems at {where} allow no array")
        items = schema.get("items", {})
        return ArrayNode(_compile(items, f"{where}/items", references), min_items, max_items)
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    for bound in (minimum, maximum):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound)
        ):
            raise SchemaNotSupported(f"minimum and maximum at {where} must be numbers")
    low = float(minimum) if isinstance(minimum, int | float) else None
    high = float(maximum) if isinstance(maximum, int | float) else None
    if low is not None and high is not None and high < low:
        raise SchemaNotSupported(f"minimum and maximum at {where} allow no number")
    if kind == "integer" and low is not None and high is not None and int(high // 1) < -int(-low // 1):
        raise SchemaNotSupported(f"minimum and maximum at {where} allow no integer")
    return ScalarNode(kind, low, high)
