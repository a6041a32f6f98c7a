"""The schema check of vLLM pods: the strict-mode keywords pass, what
xgrammar ignores or vLLM refuses is named with where it is."""

from __future__ import annotations

from typing import Any

import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel

from llmmesh.engine.schema_subset import SchemaNotSupported
from llmmesh.engine.vllm_engine.xgrammar_schema import check_schema
from tests.strict_models import MODELS, XGRAMMAR_REFUSES


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_strict_models_pass_or_are_refused_by_keyword(model: type[BaseModel]) -> None:
    schema = to_strict_json_schema(model)
    if model not in XGRAMMAR_REFUSES:
        check_schema(schema)
        return
    with pytest.raises(SchemaNotSupported) as refused:
        check_schema(schema)
    assert XGRAMMAR_REFUSES[model] in str(refused.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "uri"},
        {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 0}, "maxItems": 2},
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"$defs": {"n": {"type": ["object", "null"]}}, "anyOf": [{"$ref": "#/$defs/n"}]},
    ],
)
def test_what_xgrammar_follows_passes(schema: dict[str, Any]) -> None:
    check_schema(schema)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "if": {}, "then": {}}, "keyword 'if' at #"),
        ({"type": "object", "properties": {"a": {"not": {}}}}, "keyword 'not' at #/properties/a"),
        ({"type": "array", "items": {"type": "integer", "multipleOf": 3}}, "'multipleOf' at #/items"),
        ({"type": "array", "uniqueItems": True}, "keyword 'uniqueItems'"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "keyword 'patternProperties'"),
        ({"anyOf": [{"type": "string", "format": "color"}]}, "format 'color' at #/anyOf/0"),
        ({"type": "string", "format": "date", "maxLength": 12}, "maxLength beside format at #"),
        ({"$defs": {"s": {"type": "string", "pattern": "(?=a)a"}}}, "a lookahead"),
        ({"type": "object", "additionalProperties": {"oneOf": []}}, "'oneOf' at #/additionalProperties"),
        ([], "not an object"),
    ],
)
def test_what_xgrammar_cannot_follow_is_refused_by_name(schema: Any, words: str) -> None:
    with pytest.raises(SchemaNotSupported) as refused:
        check_schema(schema)
    assert words in str(refused.value)
