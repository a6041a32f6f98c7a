"""The JSON Schemas a vLLM pod's guided decoding (xgrammar) follows,
checked before vLLM sees them, so a refusal names the keyword and where
it is rather than vLLM's "features not supported by xgrammar".

The keywords are the strict-mode ones (:data:`engine.schema_subset.KEYWORDS`),
as for the simulator: xgrammar ignores some keywords outside them
(``if``/``then``/``else``, ``not``, ``dependentRequired``…) and would
return documents the schema rejects. Patterns use the subset of
:mod:`engine.schema_pattern` (xgrammar ignores lookaround, for one). On top,
refused because vLLM's xgrammar backend refuses or cannot honour them:
``multipleOf``, ``minLength``/``maxLength`` beside a ``pattern`` or a
``format``, and formats outside :data:`FORMATS`.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmmesh.engine import schema_subset
from llmmesh.engine.schema_pattern import parse_pattern
from llmmesh.engine.schema_subset import SchemaNotSupported, unknown_keyword

FORMATS = (
    *schema_subset.FORMATS,
    "uri",
    "uri-reference",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
)
"""The string formats xgrammar generates (vLLM's ``STRING_SUPPORTED_FORMATS``)."""


def check_schema(schema: object, where: str = "#") -> None:
    """Raise :class:`SchemaNotSupported` naming the first keyword of
    ``schema`` (depth first, in the schema's order) xgrammar cannot follow."""
    if not isinstance(schema, Mapping):
        if where == "#" or not isinstance(schema, bool):
            raise SchemaNotSupported(f"the schema at {where} is not an object")
        return
    unknown_keyword(schema, where)
    if "multipleOf" in schema:
        raise SchemaNotSupported(f"keyword 'multipleOf' at {where} is not supported by xgrammar")
    fmt = schema.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise SchemaNotSupported(
            f"format {fmt!r} at {where} is not supported; supported: {', '.join(FORMATS)}"
        )
    bounded = [keyword for keyword in ("minLength", "maxLength") if keyword in schema]
    shaped = [keyword for keyword in ("pattern", "format") if keyword in schema]
    if bounded and shaped:
        raise SchemaNotSupported(
            f"{bounded[0]} beside {shaped[0]} at {where} is not supported by xgrammar; drop one of them"
        )
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise SchemaNotSupported(f"pattern at {where} must be a string")
        parse_pattern(pattern, where)
    for keyword in ("properties", "$defs", "definitions"):
        children = schema.get(keyword, {})
        if isinstance(children, Mapping):
            for name, child in children.items():
                check_schema(child, f"{where}/{keyword}/{name}")
    for keyword in ("items", "additionalProperties"):
        if keyword in schema:
            check_schema(schema[keyword], f"{where}/{keyword}")
    options = schema.get("anyOf", [])
    for i, option in enumerate(options if isinstance(options, list) else []):
        check_schema(option, f"{where}/anyOf/{i}")
