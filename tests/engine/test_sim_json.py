"""The simulator's guided JSON: every schema of the supported subset (strict
mode's: formats, patterns, bounds, multiples, lengths, recursion) gets
valid instances, deterministic per plan; anything else is refused by name."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel

from llmmesh.engine.backend import SamplingOptions
from llmmesh.engine.sim.detokenizer import StopAwareDetokenizer
from llmmesh.engine.sim.json_schema import SchemaNotSupported, compile_schema
from llmmesh.engine.sim.json_writer import JsonWriter
from llmmesh.engine.sim.sampler import DeterministicSampler
from llmmesh.engine.sim.tokenizer import SimTokenizer
from tests.strict_models import MODELS

TOKENIZER = SimTokenizer()
SAMPLER = DeterministicSampler(TOKENIZER)
FORMATS = jsonschema.FormatChecker()
FORMATS.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
FORMAT_NAMES = ["date-time", "date", "time", "duration", "uuid", "email", "hostname", "ipv4", "ipv6"]
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
DURATION = re.compile(r"^P(\d+D)?(T(\d+H)?(\d+M)?(\d+S)?)?$")
# jsonschema checks these two only with optional packages; the test checks them itself.
FORMATS.checks("hostname")(lambda text: not isinstance(text, str) or HOSTNAME.match(text) is not None)
FORMATS.checks("duration")(lambda text: not isinstance(text, str) or DURATION.match(text) is not None)
PATTERNS = [
    r"^[a-z0-9_]{3,8}$",
    r"^\d{5}(-\d{4})?$",
    r"^[A-Z]{2}-\d{3,5}$",
    r"(cat|dog)s?",
    r"^\w+@\w+\.(com|org)$",
    r"^[^,;]{2}\s\S+$",
    r"^(?:ab|c){2,}x*$",
    r"^a.b?c+\.?$",
    r"^(?P<year>\d{4})-\d\d$",
    r"^[\d\-+]{1,4}$",
    r"^$",
]

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
    st.builds(
        lambda kind, low, span, step, open_low, open_high: {
            "type": kind,
            "exclusiveMinimum" if open_low else "minimum": low,
            "exclusiveMaximum" if open_high else "maximum": low + span,
            **({"multipleOf": step} if step else {}),
        },
        st.sampled_from(["integer", "number"]),
        st.integers(-50, 50),
        st.integers(12, 40),
        st.sampled_from([None, 1, 5, 0.5, 2.5]),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(lambda step: {"type": "number", "multipleOf": step}, st.sampled_from([0.1, 0.25, 3])),
    st.builds(
        lambda low, extra: {"type": "string", "minLength": low, "maxLength": low + extra},
        st.integers(0, 12),
        st.integers(0, 6),
    ),
    st.builds(lambda fmt: {"type": "string", "format": fmt}, st.sampled_from(FORMAT_NAMES)),
    st.builds(lambda pattern: {"type": "string", "pattern": pattern}, st.sampled_from(PATTERNS)),
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
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)
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
    with pytest.raises(SchemaNotSupported, match="no finite instance"):
        compile_schema(endless)


def test_deep_recursion_ends_through_nullable_and_typed_branches() -> None:
    """Past the depth limit the writer takes the lowest branch, whether it is
    an ``anyOf`` or a ``type`` list, though a required child leads back."""
    chain = {
        "$defs": {
            "link": {
                "type": ["object", "null"],
                "properties": {"next": {"$ref": "#/$defs/link"}, "n": {"type": "integer"}},
                "required": ["next", "n"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"head": {"$ref": "#/$defs/link"}},
        "required": ["head"],
    }
    depths = set()
    for seed in range(30):
        document = json.loads(write(chain, seed).text)
        jsonschema.validate(document, chain)
        depth, link = 0, document["head"]
        while link is not None:
            depth, link = depth + 1, link["next"]
        depths.add(depth)
    assert len(depths) > 1


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_formats_get_valid_values_that_vary_with_the_seed(fmt: str) -> None:
    schema = {"type": "string", "format": fmt}
    values = {json.loads(write(schema, seed).text) for seed in range(12)}
    for value in values:
        jsonschema.validate(value, schema, format_checker=FORMATS)
    assert len(values) > 6


def test_the_format_checker_checks() -> None:
    """The test's own checks refuse what they should."""
    for fmt, bad in [("date-time", "2024-13-01T00:00:00Z"), ("hostname", "-a.com"), ("duration", "P1X")]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, {"type": "string", "format": fmt}, format_checker=FORMATS)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_get_matching_strings_within_length_bounds(pattern: str) -> None:
    bounded = {"type": "string", "pattern": pattern, "maxLength": 9}
    for seed in range(25):
        text = json.loads(write({"type": "string", "pattern": pattern}, seed).text)
        assert re.search(pattern, text), (pattern, text)
        jsonschema.validate(json.loads(write(bounded, seed).text), bounded)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "exclusiveMinimum": 0, "multipleOf": 5},
        {"type": "integer", "minimum": -7, "maximum": 7, "multipleOf": 2.5},
        {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        {"type": "number", "exclusiveMinimum": 0.001, "exclusiveMaximum": 0.002},
        {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.1},
        {"type": "string", "minLength": 30},
        {"type": "string", "maxLength": 0},
        {"type": "string", "format": "email", "maxLength": 60},
        {"enum": ["a", 1, None], "type": "string"},
        {"const": 3, "type": ["integer", "null"]},
    ],
)
def test_bounds_multiples_and_lengths_hold(schema: dict[str, Any]) -> None:
    for seed in range(20):
        jsonschema.validate(json.loads(write(schema, seed).text), schema, format_checker=FORMATS)


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_pydantic_models_validate_what_the_simulator_writes(model: type[BaseModel]) -> None:
    """The schemas the openai SDK sends for ``parse(response_format=Model)``."""
    schema = to_strict_json_schema(model)
    for seed in range(10):
        document = json.loads(write(schema, seed).text)
        jsonschema.validate(document, schema, format_checker=FORMATS)
        model.model_validate(document)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "format": "color"}, "format 'color'"),
        ({"type": "string", "format": "date", "pattern": "^1"}, "format and pattern"),
        ({"type": "string", "format": "uuid", "maxLength": 10}, "format 'uuid'"),
        ({"type": "string", "pattern": "^(?=a)a$"}, "a lookahead ('(?='"),
        ({"type": "string", "pattern": "(?<!a)b"}, "a lookbehind"),
        ({"type": "string", "pattern": r"(a)\1"}, "a backreference"),
        ({"type": "string", "pattern": r"\bword"}, "a word boundary"),
        ({"type": "string", "pattern": "(?i)abc"}, "inline flags"),
        ({"type": "string", "pattern": "a*+"}, "possessive"),
        ({"type": "string", "pattern": "a^b"}, "an anchor after the start"),
        ({"type": "string", "pattern": "(a$)"}, "an anchor before the end"),
        ({"type": "string", "pattern": "[a-"}, "not a valid regular expression"),
        ({"type": "string", "pattern": "^[a-z]{5,}$", "maxLength": 3}, "within minLength and maxLength"),
        ({"type": "string", "minLength": 4, "maxLength": 2}, "allow no string"),
        ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "allow no integer"),
        ({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5}, "allow no integer"),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "allow no number"),
        ({"type": "number", "multipleOf": 0}, "multipleOf"),
        ({"type": "object", "if": {}, "then": {}, "else": {}}, "keyword 'if' at #"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "'patternProperties'"),
        ({"type": "object", "anyOf": [{"type": "object"}]}, "anyOf at # with 'type'"),
        ({"enum": ["a"], "minLength": 3}, "enum at # with 'minLength'"),
        ({"enum": ["a"], "type": "integer"}, "no value of enum"),
        ({"oneOf": [{"type": "string"}]}, "'oneOf'"),
        ({"allOf": [{"type": "string"}]}, "'allOf'"),
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
