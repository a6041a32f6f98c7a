"""The tool-call rules every plane shares: function names, tool choices, and
streamed parts merged back into whole calls."""

from __future__ import annotations

import pytest

from llmmesh.core.tool_calls import (
    ChoiceMode,
    ToolCallMerger,
    is_function_name,
    tool_choice_problem,
    tool_names_problem,
)
from llmmesh.v1 import common_pb2

Part = common_pb2.ToolCallDelta


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("get_weather", True),
        ("a-b_C9", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("has space", False),
        ("dotted.name", False),
        ("trailing\n", False),
        ("ünicode", False),
    ],
)
def test_function_names_follow_openai_rule(name: str, ok: bool) -> None:
    assert is_function_name(name) is ok


def test_the_first_bad_or_repeated_tool_name_is_named_by_index() -> None:
    assert tool_names_problem(["a", "b"]) is None
    assert tool_names_problem([]) is None
    bad = tool_names_problem(["a", "b c", "a"])
    assert bad is not None and bad[0] == 1 and "b c" in bad[1]
    repeated = tool_names_problem(["a", "b", "a"])
    assert repeated is not None and repeated[0] == 2 and "twice" in repeated[1]


@pytest.mark.parametrize(
    ("mode", "name", "tools", "problem"),
    [
        ("none", "", set(), None),
        ("none", "", {"f"}, None),
        ("auto", "", {"f"}, None),
        ("required", "", {"f"}, None),
        ("named", "f", {"f", "g"}, None),
        ("auto", "", set(), "needs tools"),
        ("required", "", set(), "needs tools"),
        ("named", "f", set(), "needs tools"),
        ("named", "h", {"f"}, "not one of the tools"),
        ("auto", "f", {"f"}, "names no function"),
        ("none", "f", {"f"}, "names no function"),
    ],
)
def test_tool_choice_rules(mode: ChoiceMode, name: str, tools: set[str], problem: str | None) -> None:
    found = tool_choice_problem(mode, name, tools)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_parts_merge_by_index_with_id_and_name_from_the_first_part() -> None:
    merger = ToolCallMerger()
    assert not merger
    merger.add([Part(index=1, id="call_b", name="g", arguments='{"y"'), Part(index=0, id="call_a", name="f")])
    merger.add([Part(index=0, arguments='{"x": 1}'), Part(index=1, arguments=": 2}")])
    # A later part naming the call again does not rename it.
    merger.add([Part(index=0, id="other", name="other", arguments="")])
    assert merger
    assert [(c.id, c.name, c.arguments) for c in merger.calls()] == [
        ("call_a", "f", '{"x": 1}'),
        ("call_b", "g", '{"y": 2}'),
    ]


def test_a_call_put_whole_replaces_its_parts_and_takes_more() -> None:
    merger = ToolCallMerger()
    merger.add([Part(index=0, id="pod_id", name="f", arguments='{"a"')])
    merger.put(0, common_pb2.ToolCall(id="call_own", name="f", arguments='{"a": '))
    merger.add([Part(index=0, arguments="1}")])
    assert [(c.id, c.name, c.arguments) for c in merger.calls()] == [("call_own", "f", '{"a": 1}')]
