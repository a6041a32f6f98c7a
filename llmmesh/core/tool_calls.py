"""Tool-call rules every plane shares: what a function may be named, which
tool choices need tools, and how a reply's streamed tool-call parts merge
back into whole calls.

The rules live here once; each plane reports a broken one in its own
convention (the edge as an OpenAI 400 naming ``param``, the region and the
engine as a :class:`llmmesh.core.errors.MeshError` with a Reason), so the
functions below return the problem as text, or ``None``, and raise nothing.

Parts stream as the contract says (``ToolCallDelta``): a call's first part
carries its index, id and name, later parts of that index more of its
arguments.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmmesh.v1 import common_pb2

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a function's (or a JSON schema's) name may be, as in the OpenAI API."""
FUNCTION_NAME_RULE = "1 to 64 letters, digits, underscores or dashes"

ChoiceMode = Literal["none", "auto", "required", "named"]
"""A tool choice as the rules read it, whichever type a plane holds it in."""


def is_function_name(name: str) -> bool:
    """Whether ``name`` follows :data:`FUNCTION_NAME`, whole."""
    return FUNCTION_NAME.fullmatch(name) is not None


def tool_names_problem(names: Sequence[str]) -> tuple[int, str] | None:
    """The first of the offered tools' ``names`` that is not a function name
    or repeats an earlier one, as its index and what is wrong; ``None`` when
    all are fine."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not is_function_name(name):
            return i, f"tool name {name[:80]!r} must be {FUNCTION_NAME_RULE}"
        if name in seen:
            return i, f"tool {name!r} is given twice"
        seen.add(name)
    return None


def tool_choice_problem(mode: ChoiceMode, name: str, tool_names: Collection[str]) -> str | None:
    """What is wrong with a tool choice of ``mode`` naming ``name`` among
    tools named ``tool_names``, or ``None``. Only a named choice names a
    function, and it must be one of the tools; any choice but ``none``
    needs tools to choose from."""
    if mode != "named" and name:
        return f"tool_choice {mode!r} names no function; a named choice does"
    if mode == "none":
        return None
    if not tool_names:
        return f"tool_choice {mode!r} needs tools to choose from"
    if mode == "named" and name not in tool_names:
        return f"tool_choice names {name[:80]!r}, which is not one of the tools"
    return None


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class ToolCallMerger:
    """A reply's tool calls merged from their streamed parts, by index: a
    call's id and name from the first part that has them, its arguments
    from every part, in order."""

    _calls: dict[int, _Call] = field(default_factory=dict)

    def put(self, index: int, call: common_pb2.ToolCall) -> None:
        """Take call ``index`` whole (one a reply already made), replacing
        whatever parts of that index came before."""
        self._calls[index] = _Call(call.id, call.name, [call.arguments])

    def add(self, parts: Iterable[common_pb2.ToolCallDelta]) -> None:
        for part in parts:
            call = self._calls.setdefault(part.index, _Call())
            call.id = call.id or part.id
            call.name = call.name or part.name
            call.arguments.append(part.arguments)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def calls(self) -> list[common_pb2.ToolCall]:
        """The calls so far, in index order, each with the arguments
        received so far."""
        return [
            common_pb2.ToolCall(id=c.id, name=c.name, arguments="".join(c.arguments))
            for _, c in sorted(self._calls.items())
        ]
