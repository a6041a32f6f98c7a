"""Checks on a turn's tool parts before any engine work: the tools offered,
the tool choice, and the tool calls and tool answers in its messages.

Every refusal is INVALID_ARGUMENT naming the offending field in ``param``
(``tools[2].name``, ``messages[3].tool_call_id``), as the edge reports it.
A tool message answers a call an earlier assistant message made, once: for
a conversation turn the stored history counts as earlier
(:func:`require_answered_calls` runs again once it is read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.tool_calls import (
    FUNCTION_NAME_RULE,
    ChoiceMode,
    is_function_name,
    tool_choice_problem,
    tool_names_problem,
)
from llmmesh.v1 import common_pb2

MAX_TOOLS = 128
MAX_TOOL_CALL_ID = 64
"""The zone store keeps this many characters of a tool call's id."""
MAX_TOP_LOGPROBS = 20
_ASSISTANT = common_pb2.CHAT_ROLE_ASSISTANT
_TOOL = common_pb2.CHAT_ROLE_TOOL


def _invalid(reason: Reason, message: str, param: str) -> InvalidArgument:
    return InvalidArgument(reason, message, metadata={"param": param})


_CHOICE_MODES: dict[int, ChoiceMode] = {
    common_pb2.TOOL_CHOICE_MODE_NONE: "none",
    common_pb2.TOOL_CHOICE_MODE_AUTO: "auto",
    common_pb2.TOOL_CHOICE_MODE_REQUIRED: "required",
    common_pb2.TOOL_CHOICE_MODE_NAMED: "named",
}


def validate_tools(sampling: common_pb2.SamplingParams) -> None:
    """The tools offered and how the model may choose among them, by the
    rules of :mod:`llmmesh.core.tool_calls` (the engine applies them again)."""
    if len(sampling.tools) > MAX_TOOLS:
        raise _invalid(Reason.INVALID_SAMPLING, f"at most {MAX_TOOLS} tools are allowed", "tools")
    names = [tool.name for tool in sampling.tools]
    problem = tool_names_problem(names)
    if problem is not None:
        index, message = problem
        raise _invalid(Reason.INVALID_SAMPLING, message, f"tools[{index}].name")
    for i, tool in enumerate(sampling.tools):
        if tool.parameters_json and not isinstance(_json(tool.parameters_json), dict):
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"tools[{i}].parameters must be a JSON Schema object",
                f"tools[{i}].parameters",
            )
    choice = sampling.tool_choice
    if choice.mode == common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED:
        # The contract's default: "auto" when tools are given, "none" otherwise.
        mode: ChoiceMode | None = "auto" if names else "none"
    else:
        mode = _CHOICE_MODES.get(choice.mode)
    if mode is None:
        raise _invalid(
            Reason.INVALID_SAMPLING,
            f"tool_choice.mode {choice.mode} is not a tool choice mode",
            "tool_choice",
        )
    choice_problem = tool_choice_problem(mode, choice.name, set(names))
    if choice_problem is not None:
        raise _invalid(Reason.INVALID_SAMPLING, choice_problem, "tool_choice")


def validate_logprobs(sampling: common_pb2.SamplingParams) -> None:
    """top_logprobs needs logprobs, and asks for 0 to 20 alternatives."""
    if not sampling.HasField("top_logprobs"):
        return
    if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
        raise _invalid(
            Reason.INVALID_SAMPLING, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs"
        )
    if not sampling.logprobs:
        raise _invalid(Reason.INVALID_SAMPLING, "top_logprobs needs logprobs set to true", "top_logprobs")


def validate_tool_parts(messages: Sequence[common_pb2.ChatMessage]) -> None:
    """Each message's own tool parts: calls only on assistant messages, each
    with an id and a function name; a call id only on tool messages, where
    it is required."""
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if message.tool_calls and message.role != _ASSISTANT:
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"{param}: only assistant messages make tool calls",
                f"{param}.tool_calls",
            )
        for j, call in enumerate(message.tool_calls):
            where = f"{param}.tool_calls[{j}]"
            if not call.id or len(call.id) > MAX_TOOL_CALL_ID:
                raise _invalid(
                    Reason.INVALID_REQUEST,
                    f"{where}.id must have 1 to {MAX_TOOL_CALL_ID} characters",
                    f"{where}.id",
                )
            if not is_function_name(call.name):
                raise _invalid(
                    Reason.INVALID_REQUEST,
                    f"{where}.function.name must be {FUNCTION_NAME_RULE}",
                    f"{where}.function.name",
                )
        if message.role == _TOOL and not message.tool_call_id:
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"{param} is a tool message without the tool_call_id of the call it answers",
                f"{param}.tool_call_id",
            )
        if message.tool_call_id and message.role != _TOOL:
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"{param}: only tool messages answer a tool call",
                f"{param}.tool_call_id",
            )


def validate_carried_calls(calls: Sequence[common_pb2.ToolCall]) -> None:
    """The tool calls a continuation says its client has: each names a
    function (their ids are the region's to give, :mod:`region.turn.tool_calls`)."""
    for i, call in enumerate(calls):
        if not is_function_name(call.name):
            param = f"continuation.emitted_tool_calls[{i}].name"
            raise _invalid(Reason.INVALID_REQUEST, f"{param} must be {FUNCTION_NAME_RULE}", param)


def require_answered_calls(
    history: Iterable[common_pb2.ChatMessage], messages: Sequence[common_pb2.ChatMessage]
) -> None:
    """Every tool message of ``messages`` (a turn's, ``param`` counts them)
    answers a call that ``history`` or an earlier message made, and no call
    is answered twice."""
    made: set[str] = set()
    answered: set[str] = set()

    def note(message: common_pb2.ChatMessage) -> str | None:
        """Take ``message`` in; the problem with it, if any."""
        made.update(call.id for call in message.tool_calls)
        if message.role != _TOOL:
            return None
        if message.tool_call_id not in made:
            return f"answers tool call {message.tool_call_id!r}, which no earlier assistant message made"
        if message.tool_call_id in answered:
            return f"answers tool call {message.tool_call_id!r} a second time"
        answered.add(message.tool_call_id)
        return None

    for message in history:
        note(message)
    for i, message in enumerate(messages):
        problem = note(message)
        if problem is not None:
            raise _invalid(Reason.INVALID_REQUEST, f"messages[{i}] {problem}", f"messages[{i}].tool_call_id")


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
