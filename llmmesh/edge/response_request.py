"""The body of ``POST /v1/responses`` and its translation to a chat turn.

``input`` is a string (one user message) or a list of items: messages
(roles user, system, developer and assistant; content a string or
``input_text`` / ``output_text`` / ``refusal`` parts), ``function_call``
items (consecutive ones, and an assistant message before them, become one
assistant message with tool calls) and ``function_call_output`` items (tool
messages). ``instructions`` is a system message before them.

The turn's options are chat's (:class:`edge.schemas.TurnOptions`, validated
as chat validates them): ``max_output_tokens`` is ``max_completion_tokens``,
``text.format`` is ``response_format``, flat function ``tools`` and
``tool_choice`` are chat's nested ones, and a refusal names the Responses
parameter. ``text.verbosity`` (and chat's ``verbosity``) is honoured as an
instruction (:mod:`edge.verbosity`). Refused with a 400 naming the field:
built-in tools (web search, file search, computer use, code interpreter,
MCP, ...), other item and content types (images, files, audio, reasoning,
item references), ``reasoning`` with an effort other than ``none``,
``top_logprobs``, ``include`` entries, ``background``, ``prompt``,
``truncation``, ``max_tool_calls``, the ``prompt_cache_*`` parameters,
``moderation``, ``context_management``, a non-empty ``metadata`` (a stored
response does not keep it) and ``stream_options.include_obfuscation``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictStr

from llmmesh.edge.chat_messages import missing, refused
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.request_types import AnyJson, FunctionName, Int32, ModelName, Strict, Text
from llmmesh.edge.schemas import TurnOptions, parse_body
from llmmesh.edge.verbosity import Verbosity, with_verbosity
from llmmesh.v1 import common_pb2

MAX_ITEMS = 2048
"""The most input items one request may carry."""

_ROLE: dict[str, common_pb2.ChatRole.ValueType] = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "developer": common_pb2.CHAT_ROLE_DEVELOPER,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
}

# Chat's names of the options, as this API names them in a refusal.
_PARAMS = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("stream_options", "stream_options"),
)


class FunctionTool(Strict):
    """A function the model may call, as the Responses API defines one."""

    type: StrictStr
    name: FunctionName | None = None
    description: Text | None = None
    parameters: dict[str, AnyJson] | None = None
    strict: StrictBool | None = None


class TextFormat(Strict):
    """``text.format``: text, json_object, or json_schema with its schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    description: Text | None = None
    schema_: dict[str, AnyJson] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(Strict):
    """``text``: the reply's format and verbosity."""

    format: TextFormat | None = None
    verbosity: Verbosity | None = None


class Reasoning(Strict):
    """``reasoning``: only an effort of none (the mesh's models do not reason)."""

    effort: StrictStr | None = None
    summary: StrictStr | None = None
    generate_summary: StrictStr | None = None


class ResponseStreamOptions(Strict):
    """``stream_options`` of a streamed response."""

    include_obfuscation: StrictBool | None = None


class ConversationRef(Strict):
    """``conversation`` as an object."""

    id: StrictStr


def _refusal(why: str) -> AnyJson:
    return Field(default=None, description=f"Refused when set: {why}")


class ResponseRequest(Strict):
    """``POST /v1/responses``."""

    model: ModelName
    input: StrictStr | Annotated[list[dict[str, AnyJson]], Field(max_length=MAX_ITEMS)] | None = Field(
        default=None, description="A string (one user message) or a list of input items."
    )
    instructions: Text | None = Field(default=None, description="A system message before the input.")
    max_output_tokens: Int32 | None = Field(default=None, description="The most output tokens.")
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    tools: list[dict[str, AnyJson]] | None = Field(default=None, description="Function tools only.")
    tool_choice: StrictStr | dict[str, AnyJson] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    metadata: dict[str, StrictStr] | None = Field(default=None, description="Only empty ({}).")
    user: Text | None = None
    safety_identifier: Text | None = None
    store: StrictBool | None = Field(default=None, description="Keep the response (default true).")
    previous_response_id: StrictStr | None = Field(
        default=None, description="Continue from this stored response: its input and output are the context."
    )
    conversation: StrictStr | ConversationRef | None = Field(
        default=None, description="Add the turn to this conversation (an id of /v1/conversations)."
    )
    stream: StrictBool | None = None
    stream_options: ResponseStreamOptions | None = None
    reasoning: Reasoning | None = Field(default=None, description='Only an effort of "none".')
    service_tier: StrictStr | None = Field(default=None, description='Only "auto" or "default".')
    include: list[StrictStr] | None = Field(default=None, description="Only empty.")
    top_logprobs: AnyJson = _refusal("log probabilities are not served on responses.")
    truncation: AnyJson = _refusal("a stored conversation is fitted to the window by the region.")
    background: AnyJson = _refusal("background responses are not supported.")
    prompt: AnyJson = _refusal("prompt templates are not supported.")
    max_tool_calls: AnyJson = _refusal("built-in tools are not supported.")
    prompt_cache_key: AnyJson = _refusal("prefix caching is automatic.")
    prompt_cache_retention: AnyJson = _refusal("prefix caching is automatic.")
    prompt_cache_options: AnyJson = _refusal("prefix caching is automatic.")
    moderation: AnyJson = _refusal("the region's safety filters always run.")
    context_management: AnyJson = _refusal("the region fits the context itself.")
    image: AnyJson = _refusal("images are not supported.")
    access_programs: AnyJson = _refusal("not supported.")
    background_options: AnyJson = _refusal("background responses are not supported.")

    def check_supported(self) -> None:
        """A 400 naming the first parameter set to something the mesh does not honour."""
        for name in (
            "top_logprobs",
            "truncation",
            "background",
            "prompt",
            "max_tool_calls",
            "prompt_cache_key",
            "prompt_cache_retention",
            "prompt_cache_options",
            "moderation",
            "context_management",
            "image",
            "access_programs",
            "background_options",
        ):
            if getattr(self, name) is not None:
                field = ResponseRequest.model_fields[name]
                raise refused(name, (field.description or "not supported").removeprefix("Refused when set: "))
        if self.metadata:
            raise refused("metadata", "a stored response does not keep metadata")
        if self.include:
            raise refused("include", f"{self.include[0]!r} is not served")
        if self.reasoning is not None and self.reasoning.effort not in (None, "none"):
            raise refused("reasoning.effort", "the mesh's models do not reason")
        if self.reasoning is not None and (self.reasoning.summary or self.reasoning.generate_summary):
            raise refused("reasoning.summary", "the mesh's models do not reason")
        if self.service_tier not in (None, "auto", "default"):
            raise refused("service_tier", "the tenant's tier decides how a request is served")
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(
                400, "stream_options is only allowed when stream is true", param="stream_options"
            )
        if self.stream_options is not None and self.stream_options.include_obfuscation:
            raise refused("stream_options.include_obfuscation", "the mesh does not pad its events")
        if self.previous_response_id is not None and self.conversation is not None:
            raise OpenAIError(
                400,
                "give previous_response_id or conversation, not both",
                param="previous_response_id",
                code="invalid_value",
            )
        if self.conversation is not None and self.store is False:
            raise OpenAIError(
                400, "a turn added to a conversation is stored: store cannot be false", param="store"
            )
        if self.input is None and self.previous_response_id is None and self.conversation is None:
            raise missing("input")

    def stored(self) -> bool:
        return self.store is not False

    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation

    def messages(self) -> list[common_pb2.ChatMessage]:
        """The turn's new messages: ``instructions`` and the verbosity
        instruction, then the input items."""
        messages: list[common_pb2.ChatMessage] = []
        if self.instructions:
            messages.append(
                common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content=self.instructions)
            )
        if isinstance(self.input, str):
            messages.append(common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=self.input))
        elif self.input is not None:
            messages.extend(input_messages(self.input))
        return with_verbosity(messages, self.text.verbosity if self.text else None)

    def turn_options(self) -> TurnOptions:
        """The chat options these parameters mean, validated as chat
        validates them; a refusal names the Responses parameter."""
        fields: dict[str, object] = {
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "parallel_tool_calls": self.parallel_tool_calls,
            "user": self.user,
            "safety_identifier": self.safety_identifier,
            "stream": self.stream,
        }
        if self.tools is not None:
            fields["tools"] = [_chat_tool(i, tool) for i, tool in enumerate(function_tools(self.tools))]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None:
            fields["response_format"] = _chat_format(self.text.format)
        try:
            options = parse_body(TurnOptions, {k: v for k, v in fields.items() if v is not None})
            options.to_sampling()
        except OpenAIError as err:
            raise _renamed(err) from None
        return options


def _renamed(err: OpenAIError) -> OpenAIError:
    """``err`` with its chat parameter named as this API names it."""
    param = err.param or ""
    for chat, ours in _PARAMS:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            param = ours + param[len(chat) :]
            break
    if param.startswith("tools[") and ".function." in param:
        param = param.replace(".function.", ".", 1)
    if param != (err.param or ""):
        err.message = err.message.replace(f"'{err.param}'", f"'{param}'")
        err.param = param
    return err


def function_tools(tools: list[dict[str, AnyJson]]) -> list[FunctionTool]:
    """The function tools of ``tools``; a 400 naming a tool of another type."""
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        kind = tool.get("type")
        if kind is None:
            raise missing(f"{param}.type")
        if kind != "function":
            raise refused(f"{param}.type", f"{kind} tools are not supported; use function tools")
        parsed = _parse(FunctionTool, tool, param)
        assert isinstance(parsed, FunctionTool)
        out.append(parsed)
    return out


def _chat_tool(index: int, tool: FunctionTool) -> dict[str, object]:
    param = f"tools[{index}]"
    if tool.name is None:
        raise missing(f"{param}.name")
    function: dict[str, object] = {"name": tool.name}
    for key, value in (("description", tool.description), ("parameters", tool.parameters)):
        if value is not None:
            function[key] = value
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, AnyJson]) -> object:
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise OpenAIError(
                400, "tool_choice must be none, auto, required or an object", param="tool_choice"
            )
        return choice
    kind = choice.get("type")
    if kind == "function":
        if set(choice) - {"type", "name"}:
            raise OpenAIError(400, "a function tool_choice has type and name", param="tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "allowed_tools":
        tools = choice.get("tools")
        if not isinstance(tools, list) or set(choice) - {"type", "mode", "tools"}:
            raise OpenAIError(400, "allowed_tools has type, mode and tools", param="tool_choice")
        named = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise refused(f"tool_choice.tools[{i}]", "only function tools can be allowed")
            named.append({"type": "function", "function": {"name": tool.get("name")}})
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": named}}
    raise refused("tool_choice.type", f"{kind!r} tools are not supported; choose a function")


def _chat_format(fmt: TextFormat) -> dict[str, object]:
    if fmt.type != "json_schema":
        extra = [k for k in ("name", "description", "schema_", "strict") if getattr(fmt, k) is not None]
        if extra:
            name = extra[0].rstrip("_")
            raise OpenAIError(
                400,
                f"a {fmt.type} format has no {name}",
                param=f"text.format.{name}",
                code="unknown_parameter",
            )
        return {"type": fmt.type}
    if fmt.name is None:
        raise missing("text.format.name")
    spec: dict[str, object] = {"name": fmt.name, "schema": fmt.schema_ if fmt.schema_ is not None else {}}
    if fmt.description is not None:
        spec["description"] = fmt.description
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


# ------------------------------------------------------------------ input items


class _Part(Strict):
    type: StrictStr
    text: StrictStr | None = None
    refusal: StrictStr | None = None
    annotations: list[AnyJson] | None = None
    logprobs: list[AnyJson] | None = None


class _MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[dict[str, AnyJson]]
    id: StrictStr | None = None
    status: StrictStr | None = None
    phase: StrictStr | None = None


class _FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    name: FunctionName
    arguments: Text
    id: StrictStr | None = None
    status: StrictStr | None = None


class _FunctionOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    output: StrictStr | list[dict[str, AnyJson]]
    id: StrictStr | None = None
    status: StrictStr | None = None


def _parse(model: type[Strict], item: dict[str, AnyJson], param: str) -> Strict:
    try:
        return parse_body(model, item)
    except OpenAIError as err:
        err.param = f"{param}.{err.param}" if err.param else param
        err.message = f"{param}: {err.message}"
        raise


_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _text(content: str | list[dict[str, AnyJson]], param: str, role: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, raw in enumerate(content):
        where = f"{param}[{j}]"
        kind = raw.get("type")
        if kind not in _TEXT_PARTS:
            if kind is None:
                raise missing(f"{where}.type")
            raise refused(f"{where}.type", f"{kind} content is not supported (text only)")
        part = _parse(_Part, raw, where)
        assert isinstance(part, _Part)
        if part.type in ("input_text", "output_text", "text") and part.text is not None:
            if part.annotations:
                raise refused(f"{where}.annotations", "annotations are not sent to the model; drop them")
            texts.append(part.text)
        elif part.type == "refusal" and role == "assistant" and part.refusal is not None:
            texts.append(part.refusal)
        elif part.type == "refusal":
            raise OpenAIError(400, "a refusal part is an assistant's, with 'refusal' text", param=where)
        else:
            raise missing(f"{where}.text")
    text = "".join(texts)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(400, f"{param} is not valid UTF-8 text", param=param, code="invalid_value") from exc
    return text


def input_messages(items: list[dict[str, AnyJson]]) -> list[common_pb2.ChatMessage]:
    """The chat messages of ``input`` items; a 400 names the first item (or
    field of one) refused or malformed."""
    out: list[common_pb2.ChatMessage] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _parse(_MessageItem, item, param)
            assert isinstance(message, _MessageItem)
            text = _text(message.content, f"{param}.content", message.role)
            out.append(common_pb2.ChatMessage(role=_ROLE[message.role], content=text))
        elif kind == "function_call":
            call = _parse(_FunctionCallItem, item, param)
            assert isinstance(call, _FunctionCallItem)
            last = out[-1] if out else None
            # Calls of one reply, and the reply's text before them, are one assistant message.
            if last is None or last.role != common_pb2.CHAT_ROLE_ASSISTANT:
                last = common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_ASSISTANT)
                out.append(last)
            last.tool_calls.add(id=call.call_id, name=call.name, arguments=call.arguments)
        elif kind == "function_call_output":
            result = _parse(_FunctionOutputItem, item, param)
            assert isinstance(result, _FunctionOutputItem)
            text = _text(result.output, f"{param}.output", "tool")
            out.append(
                common_pb2.ChatMessage(
                    role=common_pb2.CHAT_ROLE_TOOL, content=text, tool_call_id=result.call_id
                )
            )
        elif kind is None:
            raise missing(f"{param}.type")
        else:
            raise refused(f"{param}.type", f"{kind} items are not supported")
    return out
