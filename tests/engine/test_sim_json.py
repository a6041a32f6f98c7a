"""The simulator's guided JSON: every schema of the supported subset gets
valid instances, deterministic per plan; anything else is refused."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.engine.backend import SamplingOptions
from llmmesh.engine.sim.detokenizer import StopAwareDetokenizer
from llmmesh.engine.sim.json_schema import SchemaNotSupported, compile_schema
from llmmesh.engine.sim.json_writer import JsonWriter
from llmmesh.engine.sim.sampler import DeterministicSampler
from llmmesh.engine.sim.tokenizer import SimTokenizer

TOKENIZER = SimTokenizer()
SAMPLER = DeterministicSampler(TOKENIZER)

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6)
scalars = st.one_of(
    st.just({"type": "string"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda kind, low, span: {"type": kind, "minimum": low, "maximum": low + span},
        st.sampled_from(["integer", "number"]),
        st.integers(-50, 50),
        st.integers(1, 30),
    ),
    st.builds(lambda low: {"type": "number", "minimum": low}, st.floats(-1e3, 1e3)),
    st.builds(lambda high: {"type": "integer", "maximum": high}, st.integers(-1000, 1000)),
    st.builds(
        lambda values: {"enum": values}, st.lists(st.one_of(names, st.integers(), st.none()), min_size=1)
    ),
    st.builds(lambda value: {"const": value}, names),
    st.builds(lambda kind: {"type": [kind, "null"]}, st.sampled_from(["string", "integer", "boolean"])),
)


def _object(properties: dict[str, Any], strict: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    schema["required"] = list(properties) if strict else list(properties)[: len(properties) // 2]
    if strict:
        schema["additionalProperties"] = False
    return schema


schemas = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(_object, st.dictionaries(names, inner, max_size=4), st.booleans()),
        st.builds(
            lambda items, low, extra: {
                "type": "array",
                "items": items,
                "minItems": low,
                "maxItems": low + extra,
            },
            inner,
            st.integers(0, 2),
            st.integers(0, 2),
        ),
        st.builds(lambda options: {"anyOf": options}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=10,
)


def write(schema: dict[str, Any], seed: int, prompt: tuple[int, ...] = (1, 2, 3)) -> JsonWriter:
    plan = SAMPLER.plan(prompt, SamplingOptions(temperature=1.0, seed=seed))
    writer = JsonWriter(TOKENIZER, plan, bare_words=SAMPLER.bare_words, spaced_words=SAMPLER.words)
    compiled = compile_schema(schema)
    writer.value(compiled, compiled.root)
    return writer


@settings(max_examples=300, deadline=None)
@given(schemas, st.integers(0, 2**31))
def test_every_instance_is_valid_and_a_function_of_the_plan(schema: dict[str, Any], seed: int) -> None:
    writer = write(schema, seed)
    text = writer.text
    jsonschema.validate(json.loads(text), schema)
    assert TOKENIZER.decode([token.token_id for token in writer.tokens]) == text
    assert all(token.logprob <= 0 for token in writer.tokens)
    assert write(schema, seed).tokens == writer.tokens


def test_references_and_recursion_end() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value", "children"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    for seed in range(20):
        jsonschema.validate(json.loads(write(tree, seed).text), tree)
    linked = {
        "type": "object",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["next"],
    }
    for seed in range(20):
        jsonschema.validate(json.loads(write(linked, seed).text), linked)


def test_a_schema_without_a_finite_instance_is_refused() -> None:
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    with pytest.raises(SchemaNotSupported, match="nested"):
        write(endless, 0)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "pattern": "^a"}, "'pattern'"),
        ({"type": "string", "format": "email"}, "'format'"),
        ({"oneOf": [{"type": "string"}]}, "'oneOf'"),
        ({"allOf": [{"type": "string"}]}, "'allOf'"),
        ({"type": "number", "exclusiveMinimum": 0}, "'exclusiveMinimum'"),
        ({"type": "object", "properties": {"a": {"not": {}}}}, "'not' at #/properties/a"),
        ({"type": "date"}, "type"),
        ({"type": "object", "properties": {}, "required": ["a"]}, "required property 'a'"),
        ({"$ref": "https://example.com/schema"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "names no definition"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "allow no array"),
        ({"type": "integer", "minimum": 0.2, "maximum": 0.8}, "allow no integer"),
        ({"enum": []}, "enum"),
    ],
)
def test_keywords_outside_the_subset_are_refused(schema: dict[str, Any], words: str) -> None:
    with pytest.raises(SchemaNotSupported) as raised:
        compile_schema(schema)
    assert words in str(raised.value)


def test_non_ascii_text_streams_whole() -> None:
    """Byte-fallback characters decode only once complete, so guided text
    with them streams exactly, token by token."""
    writer = write({"enum": ["café ☕ 日本"]}, 0)
    token_ids = [token.token_id for token in writer.tokens]
    assert writer.text == '"café ☕ 日本"'
    for cut in range(len(token_ids) + 1):
        detokenizer = StopAwareDetokenizer(TOKENIZER, (), token_ids[:cut])
        streamed = "".join(detokenizer.push(token_id) for token_id in token_ids[cut:]) + detokenizer.flush()
        assert "\ufffd" not in streamed
        assert detokenizer.resumed_text + streamed == writer.text
