"""The JSON Schema subset the simulator's guided decoding follows.

The subset is what OpenAI's strict structured outputs allow
(:data:`engine.schema_subset.KEYWORDS`): ``type`` (``object``, ``array``,
``string``, ``number``, ``integer``, ``boolean``, ``null``, or a list of
them, which is how a nullable field is written), ``properties``,
``required``, ``additionalProperties``, ``items``, ``minItems``/``maxItems``,
``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``/
``multipleOf`` (:mod:`engine.sim.json_numbers`), ``minLength``/
``maxLength``, ``format`` and ``pattern`` (:mod:`engine.sim.json_strings`),
``enum``, ``const``, ``anyOf``, and ``$ref`` to ``#``, ``#/$defs/…`` or
``#/definitions/…``, recursion included. Annotations are allowed and have
no effect. Any other keyword (``oneOf``, ``allOf``, ``not``, ``if``,
``patternProperties``…) is refused with :class:`SchemaNotSupported`: the
simulator cannot promise output valid against it, and never drops it.
``enum`` and ``const`` take ``type`` beside them (the values of other
types are left out) and ``anyOf`` takes no constraint beside it.
Generated objects never carry properties beyond ``properties``, which
every ``additionalProperties`` setting allows.

Every node has a height (:func:`heights`): how deep its smallest instance
nests. A schema whose root has none (every instance is infinite) is
refused; the writer takes the lowest branches once it is deep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmmesh.engine.schema_subset import KEYWORDS, SchemaNotSupported, unknown_keyword
from llmmesh.engine.sim.json_numbers import NumberNode, number_node
from llmmesh.engine.sim.json_strings import StringNode, string_node

__all__ = ["SchemaNotSupported", "compile_schema"]

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}
ENUM_SIBLINGS = frozenset({"type", "enum", "const", "$defs", "definitions"})
ANY_OF_SIBLINGS = frozenset({"anyOf", "$defs", "definitions"})


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
    """A boolean or null, or (in a json_object reply) a plain string or integer."""

    kind: str


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


Node = (
    ObjectNode
    | ArrayNode
    | ScalarNode
    | StringNode
    | NumberNode
    | EnumNode
    | AnyOfNode
    | RefNode
    | FreeObjectNode
)


@dataclass(frozen=True)
class CompiledSchema:
    """A schema's root node, its named definitions (``#`` is the root) and
    their heights (:func:`heights`)."""

    root: Node
    definitions: Mapping[str, Node]
    heights: Mapping[str, float] = field(default_factory=dict)

    def height(self, node: Node) -> float:
        """How deep the smallest instance of ``node`` nests (inf: none is finite)."""
        return _height(node, self.heights)


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
    depths = heights(definitions)
    if math.isinf(depths["#"]):
        raise SchemaNotSupported("the schema has no finite instance: every one nests forever")
    return CompiledSchema(root, definitions, depths)


def heights(definitions: Mapping[str, Node]) -> dict[str, float]:
    """The height of every definition: the least fixed point of
    :func:`_height` over the references, from all infinite."""
    depths = dict.fromkeys(definitions, math.inf)
    changed = True
    while changed:
        changed = False
        for name, node in definitions.items():
            depth = _height(node, depths)
            if depth < depths[name]:
                depths[name], changed = depth, True
    return depths


def _height(node: Node, depths: Mapping[str, float]) -> float:
    """Objects count their required properties only, arrays their least
    items, a choice its lowest branch."""
    if isinstance(node, RefNode):
        return 1 + depths[node.target]
    if isinstance(node, ObjectNode):
        return 1 + max(
            (_height(sub, depths) for name, sub in node.properties if name in node.required), default=0
        )
    if isinstance(node, ArrayNode):
        return 1 + (_height(node.items, depths) if node.min_items else 0)
    if isinstance(node, AnyOfNode):
        return 1 + min(_height(option, depths) for option in node.options)
    return 0


def _compile(schema: object, where: str, references: list[tuple[str, str]]) -> Node:
    if not isinstance(schema, Mapping):
        raise SchemaNotSupported(f"the schema at {where} is not an object")
    unknown_keyword(schema, where, KEYWORDS)
    if where != "#" and ("$defs" in schema or "definitions" in schema):
        raise SchemaNotSupported(f"definitions at {where} are supported only at the root")
    if "$ref" in schema:
        target = schema["$ref"]
        if not isinstance(target, str) or not (
            target == "#" or target.startswith(("#/$defs/", "#/definitions/"))
        ):
            raise SchemaNotSupported(f"$ref at {where} must be '#', '#/$defs/…' or '#/definitions/…'")
        if set(schema) & (KEYWORDS - {"$ref", "$defs", "definitions"}):
            raise SchemaNotSupported(f"$ref at {where} has sibling keywords")
        references.append((target, where))
        return RefNode(target)
    if "const" in schema or "enum" in schema:
        return _enum(schema, where)
    if "anyOf" in schema:
        _only(schema, ANY_OF_SIBLINGS, "anyOf", where)
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise SchemaNotSupported(f"anyOf at {where} must be a non-empty list")
        return AnyOfNode(
            tuple(_compile(option, f"{where}/anyOf/{i}", references) for i, option in enumerate(options))
        )
    listed = _types(schema, where)
    nodes = [_typed(schema, kind, where, references) for kind in listed]
    return nodes[0] if len(nodes) == 1 else AnyOfNode(tuple(nodes))


def _only(schema: Mapping[str, object], allowed: frozenset[str], keyword: str, where: str) -> None:
    for sibling in schema:
        if sibling in KEYWORDS and sibling not in allowed:
            raise SchemaNotSupported(f"{keyword} at {where} with {sibling!r} beside it is not supported")


def _types(schema: Mapping[str, object], where: str) -> list[str]:
    kinds = schema.get("type")
    if kinds is None:
        kinds = "object" if "properties" in schema else "array" if "items" in schema else "string"
    listed = kinds if isinstance(kinds, list) else [kinds]
    if not listed or any(kind not in TYPES for kind in listed):
        raise SchemaNotSupported(f"type at {where} must be one of {', '.join(TYPES)} or a list of them")
    return [str(kind) for kind in listed]


def _enum(schema: Mapping[str, object], where: str) -> EnumNode:
    """``const`` or ``enum``, keeping the values of ``type`` when it is given."""
    _only(schema, ENUM_SIBLINGS, "const" if "const" in schema else "enum", where)
    if "const" in schema:
        values = [schema["const"]]
        if "enum" in schema and values[0] not in (schema["enum"] if isinstance(schema["enum"], list) else []):
            raise SchemaNotSupported(f"const at {where} is not among enum")
    else:
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            raise SchemaNotSupported(f"enum at {where} must be a non-empty list")
        values = enum
    if "type" in schema:
        kinds = _types(schema, where)
        values = [value for value in values if any(_is_type(value, kind) for kind in kinds)]
        if not values:
            raise SchemaNotSupported(f"no value of enum or const at {where} has the type {schema['type']!r}")
    return EnumNode(tuple(values))


def _is_type(value: object, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES[kind])


def _typed(schema: Mapping[str, object], kind: str, where: str, references: list[tuple[str, str]]) -> Node:
    if kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, Mapping) or not isinstance(required, list):
            raise SchemaNotSupported(f"properties at {where} must be an object and required a list")
        missing = [name for name in required if name not in properties]
        if missing:
            raise SchemaNotSupported(f"required property {missing[0]!r} at {where} is not in properties")
        additional = schema.get("additionalProperties", True)
        if not isinstance(additional, bool | Mapping):
            raise SchemaNotSupported(f"additionalProperties at {where} must be a boolean or a schema")
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
    if kind == "string":
        return string_node(schema, where)
    if kind in ("integer", "number"):
        return number_node(schema, kind, where)
    return ScalarNode(kind)
