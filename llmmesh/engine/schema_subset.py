"""The JSON Schema keywords guided decoding honours, shared by the engines.

:data:`KEYWORDS` is what OpenAI's strict structured outputs accept, and the
simulator follows all of it; :data:`ANNOTATIONS` are allowed and have no
effect. A keyword outside both is refused by name (:func:`unknown_keyword`),
never dropped: an engine that ignored ``if``/``then``/``else`` or
``patternProperties`` would return documents the schema rejects.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly"}
)
KEYWORDS = frozenset(
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
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "definitions",
    }
)
FORMATS = ("date-time", "date", "time", "duration", "uuid", "email", "hostname", "ipv4", "ipv6")
"""The string formats of strict mode."""


class SchemaNotSupported(ValueError):
    """The schema uses something outside the supported subset, or is malformed."""


def unknown_keyword(schema: Mapping[str, object], where: str, known: Collection[str] = KEYWORDS) -> None:
    """Raise :class:`SchemaNotSupported` naming the first keyword of
    ``schema`` (in the schema's own order) that is neither ``known`` nor an
    annotation."""
    for keyword in schema:
        if keyword not in known and keyword not in ANNOTATIONS:
            raise SchemaNotSupported(f"keyword {keyword!r} at {where} is not supported")
