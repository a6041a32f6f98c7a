"""The region's tool-call pieces on their own: call ids, parts merged back
into calls, the prompt rendering of tools, and the output filter reading
call arguments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.region.safety import RulesBackend, StreamingOutputFilter
from llmmesh.region.turn.filtered_output import FilteredOutput
from llmmesh.region.turn.prompt_render import TOOLS_HEADER, plain_turns, template_messages, template_tools
from llmmesh.region.turn.tool_calls import ToolCallLog, merge_parts, rewrite_ids, tool_call_id
from llmmesh.v1 import common_pb2

Part = common_pb2.ToolCallDelta
USER, ASSISTANT, TOOL = common_pb2.CHAT_ROLE_USER, common_pb2.CHAT_ROLE_ASSISTANT, common_pb2.CHAT_ROLE_TOOL
WEATHER = common_pb2.ToolDefinition(
    name="get_weather", description="The weather now.", parameters_json='{"type": "object"}'
)


def test_call_ids_are_fixed_by_tenant_request_and_index() -> None:
    first = tool_call_id("tenant-a", "req-1", 0)
    assert first.startswith("call_") and len(first) == len("call_") + 24
    int(first.removeprefix("call_"), 16)
    assert first == tool_call_id("tenant-a", "req-1", 0)
    others = {
        tool_call_id(*key)
        for key in (("tenant-b", "req-1", 0), ("tenant-a", "req-2", 0), ("tenant-a", "req-1", 1))
    }
    assert first not in others and len(others) == 3


def test_rewrite_replaces_only_the_pods_ids() -> None:
    parts = [Part(index=0, id="pod-7", name="f", arguments='{"a'), Part(index=0, arguments='": 1}')]
    rewritten = rewrite_ids(parts, "tenant-a", "req-1")
    assert [p.id for p in rewritten] == [tool_call_id("tenant-a", "req-1", 0), ""]
    assert parts[0].id == "pod-7"  # the pod's message is left as it was


@given(st.lists(st.tuples(st.integers(0, 2), st.text(max_size=5)), max_size=12))
def test_merged_parts_keep_every_calls_arguments(pieces: list[tuple[int, str]]) -> None:
    parts = []
    seen: set[int] = set()
    for index, text in pieces:
        first = index not in seen
        seen.add(index)
        parts.append(
            Part(index=index, id=f"c{index}" if first else "", name="f" if first else "", arguments=text)
        )
    whole, merged = ToolCallLog(), ToolCallLog()
    whole.add(parts)
    merged.add(merge_parts(parts))
    assert whole.calls() == merged.calls()
    assert len(merge_parts(parts)) <= len(parts)


def test_a_log_goes_on_from_the_calls_a_continuation_carries() -> None:
    log = ToolCallLog()
    log.carry([common_pb2.ToolCall(id="whatever", name="f", arguments='{"a": ')], "tenant-a", "req-1")
    log.add([Part(index=0, arguments="1}"), Part(index=1, id="call_y", name="g", arguments="{}")])
    assert [(c.id, c.name, json.loads(c.arguments)) for c in log.calls()] == [
        (tool_call_id("tenant-a", "req-1", 0), "f", {"a": 1}),
        ("call_y", "g", {}),
    ]


def test_tools_render_as_a_system_turn_after_the_leading_system_messages() -> None:
    messages = [
        common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content="Be brief."),
        common_pb2.ChatMessage(role=USER, content="Weather?"),
        common_pb2.ChatMessage(
            role=ASSISTANT,
            tool_calls=[common_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"c": 1}')],
        ),
        common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_1"),
    ]
    turns = plain_turns(messages, [WEATHER])
    assert [role for role, _ in turns] == ["system", "system", "user", "assistant", "tool"]
    assert turns[1][1].splitlines()[: len(TOOLS_HEADER.splitlines())] == TOOLS_HEADER.splitlines()
    assert json.loads(turns[1][1].splitlines()[-1]) == {
        "name": "get_weather",
        "description": "The weather now.",
        "parameters": {"type": "object"},
    }
    assert json.loads(turns[3][1]) == {
        "tool_call": {"id": "call_1", "name": "get_weather", "arguments": {"c": 1}}
    }
    assert json.loads(turns[4][1]) == {"tool_call_id": "call_1", "content": "12 C"}
    # Without tool parts, a prompt renders as it always did.
    assert plain_turns(messages[:2]) == [("system", "Be brief."), ("user", "Weather?")]
    assert plain_turns(messages[1:2], [WEATHER])[0][0] == "system"


def test_a_chat_template_gets_tools_as_vllm_hands_them_over() -> None:
    messages = [
        common_pb2.ChatMessage(
            role=ASSISTANT,
            tool_calls=[common_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"c": 1}')],
        ),
        common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_1"),
    ]
    assert template_messages(messages) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"c": 1}},
                }
            ],
        },
        {"role": "tool", "content": "12 C", "tool_call_id": "call_1"},
    ]
    assert template_tools([WEATHER]) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather now.",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert template_tools([]) is None


@pytest.mark.asyncio
async def test_the_output_filter_reads_call_arguments_and_releases_parts_with_their_delta() -> None:
    rules = RulesBackend(deny_terms={"violence": ("stab him",)})
    clean = FilteredOutput(StreamingOutputFilter([rules], window_chars=32, overlap_chars=12))
    released = []
    pieces = [
        Part(index=0, id="call_1", name="note", arguments='{"text": "'),
        Part(index=0, arguments='hello"}'),
    ]
    for n, part in enumerate(pieces):
        released.append(await clean.feed("", (n,), (part,)))
    released.append(await clean.finish())
    merged = merge_parts([p for r in released for p in r.tool_calls])
    assert [(p.id, p.arguments) for p in merged] == [("call_1", '{"text": "hello"}')]
    assert [t for r in released for t in r.token_ids] == [0, 1]

    flagged = FilteredOutput(StreamingOutputFilter([rules], window_chars=32, overlap_chars=12))
    for n, text in enumerate(['{"text": "I will st', "ab ", 'him"}']):
        part = (
            Part(index=0, id="call_1", name="note", arguments=text)
            if n == 0
            else Part(index=0, arguments=text)
        )
        release = await flagged.feed("", (n,), (part,))
        assert "st" not in "".join(p.arguments for p in release.tool_calls)
    assert flagged.stopped is not None and "violence" in flagged.stopped.categories


@pytest.mark.asyncio
async def test_held_deltas_go_out_with_their_logprobs_in_order() -> None:
    output = FilteredOutput(StreamingOutputFilter([RulesBackend()], window_chars=32, overlap_chars=12))
    released = []
    # Digits that may grow into a card number are held until their run ends, then released merged.
    for n, text in enumerate(["41", "11", " apples", "! "]):
        entry = common_pb2.TokenLogprob(token_id=n, token=text, logprob=-float(n))
        released.append(await output.feed(text, (n,), (), (entry,)))
    released.append(await output.finish())
    assert [e.token_id for r in released for e in r.logprobs] == [t for r in released for t in r.token_ids]
    assert [t for r in released for t in r.token_ids] == [0, 1, 2, 3]
    assert any(len(r.logprobs) > 1 for r in released)
