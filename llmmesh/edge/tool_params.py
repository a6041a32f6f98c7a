"""``tools``, ``tool_choice`` and ``response_format`` of a chat request, and
their translation to the contract's ToolDefinition, ToolChoice and
ResponseFormat.

Honoured: function tools; tool_choice "none", "auto", "required", a named
function and ``allowed_tools`` (the tools the model sees are narrowed to the
allowed ones, with its mode); response_format text, json_object and
json_schema. Refused with a 400 naming the field: custom tools and a custom
tool_choice, a named or allowed function that is not among ``tools``, and a
tool_choice other than "none" without tools.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, StrictBool

from llmmesh.edge.chat_messages import missing, refused
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.request_types import AnyJson, FunctionName, Strict, Text
from llmmesh.v1 import common_pb2

MAX_TOOLS = 128
"""The most tools one request may offer, as OpenAI's API allows."""


class FunctionDefinition(Strict):
    """A function the model may call."""

    name: FunctionName
    description: Text | None = None
    parameters: dict[str, AnyJson] | None = Field(default=None, description="A JSON Schema object.")
    strict: StrictBool | None = None


class Tool(Strict):
    """A tool: a function (custom tools are refused)."""

    type: Literal["function", "custom"]
    function: FunctionDefinition | None = None
    custom: AnyJson = Field(default=None, description="Refused: custom tools are not supported.")


class FunctionRef(Strict):
    """Names a function."""

    name: FunctionName


class NamedToolChoice(Strict):
    """``{"type": "function", "function": {"name": ...}}``: call this function."""

    type: Literal["function", "custom"]
    function: FunctionRef | None = None
    custom: AnyJson = Field(default=None, description="Refused: custom tools are not supported.")


class AllowedTools(Strict):
    """The tools the model may use, and whether it must use one."""

    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedToolChoice], Field(min_length=1, max_length=MAX_TOOLS)]


class AllowedToolsChoice(Strict):
    """``{"type": "allowed_tools", "allowed_tools": {...}}``."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoiceParam = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice

_MODE: dict[str, common_pb2.ToolChoiceMode.ValueType] = {
    "none": common_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


def _function_name(choice: NamedToolChoice, param: str) -> str:
    if choice.type == "custom" or choice.custom is not None or choice.function is None:
        raise refused(param, "custom tools are not supported; name a function")
    return choice.function.name


def tool_definitions(tools: list[Tool]) -> list[common_pb2.ToolDefinition]:
    """The contract's tools; a 400 names a refused or repeated one."""
    out: list[common_pb2.ToolDefinition] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if tool.type == "custom" or tool.custom is not None:
            raise refused(f"{param}.type", "custom tools are not supported; use function tools")
        if tool.function is None:
            raise missing(f"{param}.function")
        fn = tool.function
        if any(d.name == fn.name for d in out):
            raise OpenAIError(
                400,
                f"tool '{fn.name}' is defined twice",
                param=f"{param}.function.name",
                code="invalid_value",
            )
        out.append(
            common_pb2.ToolDefinition(
                name=fn.name,
                description=fn.description or "",
                parameters_json=json.dumps(fn.parameters) if fn.parameters is not None else "",
                strict=bool(fn.strict),
            )
        )
    return out


def apply_tool_choice(
    choice: ToolChoiceParam | None,
    tools: list[common_pb2.ToolDefinition],
    sampling: common_pb2.SamplingParams,
) -> None:
    """Set ``sampling.tools`` and ``sampling.tool_choice`` from the request's
    ``tools`` (already translated) and ``tool_choice``; a 400 names a choice
    that cannot be honoured."""
    names = {t.name for t in tools}
    if choice is None:
        sampling.tools.extend(tools)
        return
    if choice != "none" and not tools:
        raise OpenAIError(
            400, "tool_choice needs tools to choose from", param="tool_choice", code="invalid_value"
        )
    if isinstance(choice, str):
        sampling.tool_choice.mode = _MODE[choice]
        sampling.tools.extend(tools)
        return
    if isinstance(choice, NamedToolChoice):
        name = _function_name(choice, "tool_choice")
        if name not in names:
            raise OpenAIError(
                400,
                f"tool_choice names '{name}', which is not among tools",
                param="tool_choice.function.name",
                code="invalid_value",
            )
        sampling.tool_choice.mode = common_pb2.TOOL_CHOICE_MODE_NAMED
        sampling.tool_choice.name = name
        sampling.tools.extend(tools)
        return
    allowed: set[str] = set()
    for i, entry in enumerate(choice.allowed_tools.tools):
        param = f"tool_choice.allowed_tools.tools[{i}]"
        name = _function_name(entry, param)
        if name not in names:
            raise OpenAIError(
                400, f"allowed tool '{name}' is not among tools", param=param, code="invalid_value"
            )
        allowed.add(name)
    sampling.tool_choice.mode = _MODE[choice.allowed_tools.mode]
    # The model sees only the allowed tools: that is what allowed_tools asks.
    sampling.tools.extend(t for t in tools if t.name in allowed)


class JsonSchemaFormat(Strict):
    """The schema of a json_schema response format."""

    name: FunctionName
    description: Text | None = None
    schema_: dict[str, AnyJson] | None = Field(default=None, alias="schema", description="A JSON Schema.")
    strict: StrictBool | None = None


class ResponseFormat(Strict):
    """``response_format``: text, json_object, or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def to_proto(self) -> common_pb2.ResponseFormat:
        if self.type != "json_schema":
            if self.json_schema is not None:
                raise OpenAIError(
                    400,
                    f"a {self.type} response_format has no json_schema",
                    param="response_format.json_schema",
                    code="unknown_parameter",
                )
            kind = (
                common_pb2.RESPONSE_FORMAT_TYPE_TEXT
                if self.type == "text"
                else common_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT
            )
            return common_pb2.ResponseFormat(type=kind)
        if self.json_schema is None:
            raise missing("response_format.json_schema")
        spec = self.json_schema
        return common_pb2.ResponseFormat(
            type=common_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
            schema_name=spec.name,
            schema_json=json.dumps(spec.schema_ if spec.schema_ is not None else {}),
            strict=bool(spec.strict),
        )
