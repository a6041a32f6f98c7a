"""The streaming tool-call parser and the schema that guides tool calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmesh.engine.backend import ToolCallPart, ToolChoiceMode, ToolChoiceSpec, ToolSpec
from llmmesh.engine.tool_calls import ToolCallParser, ToolCallSyntaxError, tool_call_schema


def call_id(index: int) -> str:
    return f"call-{index}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
names = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)
separators = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])


def chunks(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at the given positions."""
    points = sorted({cut % (len(text) + 1) for cut in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(text[start:point])
        start = point
    pieces.append(text[start:])
    return pieces


def collect(parts: list[ToolCallPart]) -> dict[int, tuple[str, str, str]]:
    """Each call's (id, name, arguments), checking the parts' order: a call's
    first part has id and name, later ones neither."""
    calls: dict[int, tuple[str, str, str]] = {}
    for part in parts:
        if part.index not in calls:
            assert part.index == len(calls), "calls start in index order"
            assert part.id and part.name
            calls[part.index] = (part.id, part.name, part.arguments)
        else:
            assert not part.id and not part.name
            call = calls[part.index]
            calls[part.index] = (call[0], call[1], call[2] + part.arguments)
    return calls


def array_text(calls: list[tuple[str, str]], separator: tuple[str, str], name_first: bool) -> str:
    """The array format with each call's arguments given as JSON text."""
    item, key = separator
    objects = []
    for name, arguments in calls:
        fields = [f'"name"{key}{json.dumps(name)}', f'"arguments"{key}{arguments}']
        if not name_first:
            fields.reverse()
        objects.append("{" + item.join(fields) + "}")
    return " [" + item.join(objects) + "]\n"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(names, arguments_objects), min_size=1, max_size=4),
    separators,
    st.booleans(),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_array_fragments_concatenate_to_each_calls_arguments(
    calls: list[tuple[str, dict[str, object]]],
    separator: tuple[str, str],
    name_first: bool,
    cuts: list[int],
) -> None:
    written = [(name, json.dumps(arguments, separators=separator)) for name, arguments in calls]
    text = array_text(written, separator, name_first)
    parser = ToolCallParser(None, call_id)
    parts = [part for piece in chunks(text, cuts) for part in parser.feed(piece)]
    assert parser.complete
    assert parser.calls == len(calls)
    got = collect(parts)
    assert [got[i] for i in range(len(calls))] == [
        (call_id(i), name, arguments) for i, (name, arguments) in enumerate(written)
    ]
    assert [json.loads(got[i][2]) for i in range(len(calls))] == [arguments for _, arguments in calls]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(names, arguments_objects), min_size=1, max_size=3),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.integers(0, 10_000),
)
def test_a_primed_parser_goes_on_as_an_unbroken_one(
    calls: list[tuple[str, dict[str, object]]], cuts: list[int], resume_at: int
) -> None:
    """A continuation primed with the text streamed so far emits exactly the
    parts an unbroken parser emits after that point."""
    text = array_text([(name, json.dumps(arguments)) for name, arguments in calls], (", ", ": "), True)
    split = resume_at % (len(text) + 1)
    before, after = text[:split], text[split:]
    unbroken = ToolCallParser(None, call_id)
    first = unbroken.feed(before)
    rest = [part for piece in chunks(after, cuts) for part in unbroken.feed(piece)]
    resumed = ToolCallParser(None, call_id)
    resumed.prime(before)
    assert [part for piece in chunks(after, cuts) for part in resumed.feed(piece)] == rest
    assert collect(first + rest) == collect(ToolCallParser(None, call_id).feed(text))


@settings(max_examples=200, deadline=None)
@given(arguments_objects, st.lists(st.integers(0, 10_000), max_size=8), st.integers(0, 10_000))
def test_named_output_is_the_arguments_verbatim(
    arguments: dict[str, object], cuts: list[int], resume_at: int
) -> None:
    text = "\n" + json.dumps(arguments, indent=1) + " "
    parser = ToolCallParser("lookup", call_id)
    parts = [part for piece in chunks(text, cuts) for part in parser.feed(piece)]
    assert parser.complete
    assert collect(parts) == {0: ("call-0", "lookup", text)}
    split = resume_at % (len(text) + 1)
    unbroken = ToolCallParser("lookup", call_id)
    first = unbroken.feed(text[:split])
    rest = unbroken.feed(text[split:])
    resumed = ToolCallParser("lookup", call_id)
    resumed.prime(text[:split])
    assert resumed.feed(text[split:]) == rest
    assert collect(first + rest) == {0: ("call-0", "lookup", text)}


def test_named_parts_after_priming_carry_no_id() -> None:
    parser = ToolCallParser("lookup", call_id)
    parser.prime('{"a"')
    assert parser.feed(": 1}") == [ToolCallPart(0, arguments=": 1}")]
    assert parser.complete and parser.calls == 1


def test_the_name_is_announced_as_soon_as_it_is_complete() -> None:
    parser = ToolCallParser(None, call_id)
    assert parser.feed('[{"name": "get_wea') == []
    assert parser.feed('ther", "argu') == [ToolCallPart(0, "call-0", "get_weather", "")]
    assert parser.feed('ments": {"city"') == [ToolCallPart(0, arguments='{"city"')]
    assert parser.feed(': "Paris"}}, {"arguments": {}, "name": "x"}]') == [
        ToolCallPart(0, arguments=': "Paris"}'),
        ToolCallPart(1, "call-1", "x", "{}"),
    ]
    assert parser.complete and parser.calls == 2


def test_escapes_in_names_and_strings_are_read_as_json() -> None:
    parser = ToolCallParser(None, call_id)
    text = '[{"name": "a\\u0062", "arguments": {"q": "}\\"]{"}}]'
    assert collect(parser.feed(text)) == {0: ("call-0", "ab", '{"q": "}\\"]{"}')}
    assert parser.complete


def test_an_unfinished_output_is_not_complete() -> None:
    parser = ToolCallParser(None, call_id)
    parser.feed('[{"name": "f", "arguments": {"a": [1, ')
    assert not parser.complete and parser.calls == 1


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "arguments": {}}',  # not an array
        '[{"name": "f", "arguments": "{}"}]',  # arguments as a string
        '[{"name": "f", "extra": 1, "arguments": {}}]',
        '[{"name": "f", "name": "g", "arguments": {}}]',
        '[{"name": "f"}]',
        '[{"name": 3, "arguments": {}}]',
        '[{"name": "f", "arguments": {}}] x',
        '[{"name": "f", "arguments": {}},]',
        '[{"name" "f"}]',
    ],
)
def test_format_breaks_are_refused(text: str) -> None:
    with pytest.raises(ToolCallSyntaxError):
        ToolCallParser(None, call_id).feed(text)


@pytest.mark.parametrize("text", ["[1, 2]", "x{}", "{} x"])
def test_named_format_breaks_are_refused(text: str) -> None:
    with pytest.raises(ToolCallSyntaxError):
        ToolCallParser("f", call_id).feed(text)


WEATHER = ToolSpec(
    "get_weather",
    parameters_json=json.dumps(
        {
            "type": "object",
            "properties": {"place": {"$ref": "#/$defs/place"}},
            "required": ["place"],
            "additionalProperties": False,
            "$defs": {"place": {"type": "string"}},
        }
    ),
)
CLOCK = ToolSpec("get_time")


def test_the_named_schema_is_the_tools_parameters() -> None:
    schema = tool_call_schema((WEATHER, CLOCK), ToolChoiceSpec(ToolChoiceMode.NAMED, "get_weather"), True)
    assert schema == json.loads(WEATHER.parameters_json)
    named_clock = tool_call_schema((WEATHER, CLOCK), ToolChoiceSpec(ToolChoiceMode.NAMED, "get_time"), True)
    assert named_clock == {"type": "object", "properties": {}, "additionalProperties": False}


def test_the_array_schema_lists_each_tool_and_moves_definitions_to_the_root() -> None:
    schema = tool_call_schema((WEATHER, CLOCK), ToolChoiceSpec(ToolChoiceMode.REQUIRED), False)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert schema["$defs"] == {"tool0_place": {"type": "string"}}
    items = schema["items"]
    assert isinstance(items, dict)
    first, second = items["anyOf"]
    assert first["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert first["properties"]["arguments"]["properties"]["place"] == {"$ref": "#/$defs/tool0_place"}
    assert "$defs" not in first["properties"]["arguments"]
    assert second["properties"]["name"]["enum"] == ["get_time"]
    assert "maxItems" not in tool_call_schema((WEATHER,), ToolChoiceSpec(ToolChoiceMode.REQUIRED), True)
