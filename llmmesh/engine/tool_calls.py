"""Tool calls in a pod's output: the format a guided generation writes them
in, the JSON Schema that guides it, and the streaming parser that turns its
text into :class:`engine.backend.ToolCallPart` fragments. Both engines (vLLM
and the simulator) use this module, so both stream tool calls alike.

The output format:

- ``tool_choice`` named: the whole output is the arguments of the one call,
  a JSON object (whitespace around it is kept in the arguments' text).
- ``tool_choice`` required, and auto when the engine decides to call: a JSON
  array of one call object per call,
  ``[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]``. A call
  object has exactly the keys ``name`` (a string) and ``arguments`` (an
  object). Engines write ``name`` first; the parser accepts either order,
  holding the arguments back until the name is known.

The parser is fed the output's text as it streams. It emits a call's first
part (index, id, name) as soon as the name is complete, and every character
of the arguments as soon as it is fed, so concatenating one call's
``arguments`` parts gives exactly the arguments' JSON text as written. A
continuation primes it with the resumed output's text (:meth:`prime`), which
re-derives the state without emitting, so the stream goes on mid-call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum, auto

from llmmesh.engine.backend import ToolCallPart, ToolChoiceMode, ToolChoiceSpec, ToolSpec

NO_PARAMETERS_SCHEMA: dict[str, object] = {"type": "object", "properties": {}, "additionalProperties": False}
"""The parameters of a tool that declares none: an empty object."""

_WHITESPACE = " \t\n\r"


class ToolCallSyntaxError(ValueError):
    """The output does not follow the tool-call format."""


def parameters_schema(tool: ToolSpec) -> dict[str, object]:
    """A tool's parameters schema as a dict (empty text: no parameters).
    Raises ValueError unless it is a JSON object."""
    if not tool.parameters_json:
        return dict(NO_PARAMETERS_SCHEMA)
    schema = json.loads(tool.parameters_json)
    if not isinstance(schema, dict):
        raise ValueError(f"the parameters of tool {tool.name!r} are not a JSON object")
    return schema


def tool_call_schema(
    tools: tuple[ToolSpec, ...], choice: ToolChoiceSpec, parallel_tool_calls: bool
) -> dict[str, object]:
    """The JSON Schema a guided generation follows for ``choice`` (named,
    required, or auto once the engine decided to call): the named tool's
    parameters, or an array of at least one call object (at most one
    without ``parallel_tool_calls``). In the array form each tool's
    ``$defs`` move to the root, renamed ``tool<i>_<name>``, and its
    ``#/$defs/...`` references with them. Raises ValueError for a
    parameters schema that is not a JSON object."""
    if choice.mode == ToolChoiceMode.NAMED:
        tool = next(tool for tool in tools if tool.name == choice.name)
        return parameters_schema(tool)
    variants: list[dict[str, object]] = []
    defs: dict[str, object] = {}
    for i, tool in enumerate(tools):
        arguments = parameters_schema(tool)
        own_defs = arguments.pop("$defs", None)
        prefix = f"tool{i}_"
        if isinstance(own_defs, dict):
            for key, value in own_defs.items():
                defs[prefix + key] = _rebase_refs(value, prefix)
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.name]},
                    "arguments": _rebase_refs(arguments, prefix),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    array: dict[str, object] = {
        "type": "array",
        "items": variants[0] if len(variants) == 1 else {"anyOf": variants},
        "minItems": 1,
    }
    if not parallel_tool_calls:
        array["maxItems"] = 1
    if defs:
        array["$defs"] = defs
    return array


def _rebase_refs(node: object, prefix: str) -> object:
    """``node`` with every ``#/$defs/X`` reference renamed ``#/$defs/<prefix>X``,
    as the tools' definitions are gathered under one root."""
    if isinstance(node, dict):
        result: dict[str, object] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                result[key] = "#/$defs/" + prefix + value.removeprefix("#/$defs/")
            else:
                result[key] = _rebase_refs(value, prefix)
        return result
    if isinstance(node, list):
        return [_rebase_refs(item, prefix) for item in node]
    return node


class _State(Enum):
    BEFORE_ARRAY = auto()
    ARRAY_START = auto()  # after "[": a call or "]"
    ARRAY_NEXT = auto()  # after a call: "," or "]"
    ARRAY_ITEM = auto()  # after ",": a call
    OBJECT_START = auto()  # after "{": a key or "}"
    OBJECT_KEY = auto()  # after ",": a key
    KEY = auto()  # inside a key's string
    COLON = auto()
    VALUE = auto()  # before a value of the current key
    NAME = auto()  # inside the name's string
    ARGUMENTS = auto()  # inside the arguments object
    OBJECT_NEXT = auto()  # after a value: "," or "}"
    DONE = auto()  # after "]", or after a named call's object


class ToolCallParser:
    """Streams the tool calls of one generation's output text.

    ``named``: the function of a named tool choice (the output is its
    arguments), or None for the array format. ``call_id(index)`` gives the
    id of call ``index``. Raises :class:`ToolCallSyntaxError` at the first
    character that breaks the format; the parser is then unusable.
    """

    def __init__(self, named: str | None, call_id: Callable[[int], str]) -> None:
        self._named = named
        self._call_id = call_id
        self._state = _State.ARGUMENTS if named is not None else _State.BEFORE_ARRAY
        # The call being read (array format): its index, name and whether its
        # first part went out; arguments read before the name wait in _held.
        self._index = 0 if named is not None else -1
        self._name: str | None = named
        self._announced = False
        self._held: list[str] = []
        self._keys: set[str] = set()
        self._buffer: list[str] = []  # a key's or name's raw JSON string
        self._key = ""
        self._escaped = False
        self._in_string = False
        self._depth = 0
        self._parts: list[ToolCallPart] = []
        self._emitting = True

    @property
    def calls(self) -> int:
        """Calls whose first part is out (or would be, after priming)."""
        return self._index + 1 if self._announced else max(self._index, 0)

    @property
    def complete(self) -> bool:
        """True once the output holds a whole, well-formed set of calls."""
        return self._state is _State.DONE

    def prime(self, text: str) -> None:
        """Read ``text`` (output streamed before a continuation) without emitting."""
        self._emitting = False
        try:
            self.feed(text)
        finally:
            self._emitting = True

    def feed(self, text: str) -> list[ToolCallPart]:
        """Read more output text; return the parts it completes, argument
        fragments of one call merged."""
        self._parts = []
        for char in text:
            self._step(char)
        return self._parts

    def _step(self, char: str) -> None:
        state = self._state
        if state is _State.ARGUMENTS:
            self._arguments_char(char)
        elif state in (_State.KEY, _State.NAME):
            self._string_char(char)
        elif char in _WHITESPACE:
            if state is _State.DONE and self._named is not None:
                self._emit_arguments(char)  # whitespace after a named call's object is its text too
        elif state is _State.BEFORE_ARRAY:
            self._expect(char, "[", _State.ARRAY_START)
        elif state in (_State.ARRAY_START, _State.ARRAY_ITEM):
            if char == "]" and state is _State.ARRAY_START:
                self._state = _State.DONE
            else:
                self._expect(char, "{", _State.OBJECT_START)
                self._begin_call()
        elif state is _State.ARRAY_NEXT:
            if char == "]":
                self._state = _State.DONE
            else:
                self._expect(char, ",", _State.ARRAY_ITEM)
        elif state in (_State.OBJECT_START, _State.OBJECT_KEY):
            if char == "}" and state is _State.OBJECT_START:
                self._end_call()
            else:
                self._expect(char, '"', _State.KEY)
                self._buffer = ['"']
        elif state is _State.COLON:
            self._expect(char, ":", _State.VALUE)
        elif state is _State.VALUE:
            self._value_start(char)
        elif state is _State.OBJECT_NEXT:
            if char == "}":
                self._end_call()
            else:
                self._expect(char, ",", _State.OBJECT_KEY)
        else:
            raise ToolCallSyntaxError(f"unexpected {char!r} after the tool calls")

    def _expect(self, char: str, wanted: str, then: _State) -> None:
        if char != wanted:
            raise ToolCallSyntaxError(f"expected {wanted!r}, got {char!r}")
        self._state = then

    def _begin_call(self) -> None:
        self._index += 1
        self._name = None
        self._announced = False
        self._held = []
        self._keys = set()

    def _end_call(self) -> None:
        missing = {"name", "arguments"} - self._keys
        if missing:
            raise ToolCallSyntaxError(f"tool call {self._index} lacks {', '.join(sorted(missing))}")
        self._state = _State.ARRAY_NEXT

    def _string_char(self, char: str) -> None:
        self._buffer.append(char)
        if self._escaped:
            self._escaped = False
            return
        if char == "\\":
            self._escaped = True
            return
        if char != '"':
            return
        try:
            value = json.loads("".join(self._buffer))
        except json.JSONDecodeError as exc:
            raise ToolCallSyntaxError(f"a bad string in tool call {self._index}: {exc}") from exc
        if self._state is _State.KEY:
            if value not in ("name", "arguments"):
                raise ToolCallSyntaxError(f"tool call {self._index} has an unknown key {value!r}")
            if value in self._keys:
                raise ToolCallSyntaxError(f"tool call {self._index} repeats {value!r}")
            self._keys.add(value)
            self._key = value
            self._state = _State.COLON
            return
        self._name = value
        self._state = _State.OBJECT_NEXT
        self._announce()

    def _value_start(self, char: str) -> None:
        if self._key == "name":
            self._expect(char, '"', _State.NAME)
            self._buffer = ['"']
            return
        self._expect(char, "{", _State.ARGUMENTS)
        self._depth = 0
        self._arguments_char(char)

    def _arguments_char(self, char: str) -> None:
        if self._depth == 0 and not self._in_string:
            # Before the object (named format) or at its first character.
            if char in _WHITESPACE and self._named is not None:
                self._emit_arguments(char)
                return
            if char != "{":
                raise ToolCallSyntaxError(f"the arguments must be a JSON object, got {char!r}")
        self._emit_arguments(char)
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._state = _State.DONE if self._named is not None else _State.OBJECT_NEXT

    def _announce(self) -> None:
        """Emit the first part of the current call, with the held arguments."""
        self._announced = True
        held = "".join(self._held)
        self._held = []
        if self._emitting:
            assert self._name is not None
            self._parts.append(ToolCallPart(self._index, self._call_id(self._index), self._name, held))

    def _emit_arguments(self, text: str) -> None:
        if not self._announced:
            if self._named is None:
                self._held.append(text)
                return
            self._announce()
        if not self._emitting:
            return
        last = self._parts[-1] if self._parts else None
        if last is not None and last.index == self._index:
            self._parts[-1] = ToolCallPart(last.index, last.id, last.name, last.arguments + text)
        else:
            self._parts.append(ToolCallPart(self._index, arguments=text))
