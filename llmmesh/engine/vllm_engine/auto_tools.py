"""``tool_choice`` auto on vLLM: the model decides, in a tool-call syntax,
and vLLM's tool parser for that syntax finds the calls in the streamed text
(as ``vllm serve --tool-call-parser NAME`` does).

The syntax is read from the served chat template
(:func:`tool_parser_for_template`): a template that renders ``tools`` and
writes calls as ``<tool_call>`` JSON ``</tool_call>`` (Hermes, Qwen and
most ChatML models) gets vLLM's ``hermes`` parser. A template that renders
no tools gets the same syntax: the region writes the tools into such a
prompt as text, and a call the model makes is read as Hermes writes it. A
template that renders tools in a syntax not known here is refused auto
(``INVALID_ARGUMENT``, param ``tool_choice``), not answered as if no tools
were given; required and named choices work with any template.

Calls are guided as vLLM guides them for ``--tool-strict-level parameter``:
the text is free until the model opens a ``<tool_call>``; from there xgrammar's
structural tag makes it a call of one of the tools with arguments valid
against its schema (one call at most without ``parallel_tool_calls``).
With a JSON response format the reply is either tool calls or the JSON
(vLLM's ``OrFormat`` of the two). The random-weight tiny model writes the
opening tag about never, so its auto replies are text.

vLLM's parsers and its OpenAI request types are imported on the first
auto request, so plain turns and pod startup never pay for them.
"""

from __future__ import annotations

import json
from typing import Any

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import ToolCallPart, ToolSpec

# The call markers of a template's tool-call syntax, and vLLM's parser for it.
_PARSERS_BY_MARKER = (("<tool_call>", "hermes"),)
# The syntax read from a model whose template renders no tools.
DEFAULT_PARSER = "hermes"


def tool_parser_for_template(template: str | None) -> str | None:
    """vLLM's tool-parser name for the call syntax ``template`` teaches
    (Hermes' when it renders no tools), None for a syntax not known here."""
    if not template or "tools" not in template:
        return DEFAULT_PARSER
    for marker, parser in _PARSERS_BY_MARKER:
        if marker in template:
            return parser
    return None


def refuse_auto() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_SAMPLING,
        "tool_choice 'auto' needs a tool-call syntax this pod can parse; this model's chat template "
        "teaches another one, use tool_choice 'required' or a named tool",
        metadata={"param": "tool_choice"},
    )


def _function(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description}
    if tool.parameters_json:
        function["parameters"] = json.loads(tool.parameters_json)
    return {"type": "function", "function": function}


class AutoToolCalls:
    """One generation's output through vLLM's streaming tool parser:
    :meth:`feed` splits new text into content and :class:`ToolCallPart`s."""

    def __init__(self, parser_name: str, tokenizer: Any, tools: tuple[ToolSpec, ...]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        request = ChatCompletionRequest(
            messages=[], tools=[_function(tool) for tool in tools], tool_choice="auto"
        )
        self._parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer, request.tools)
        self._request = self._parser.adjust_request(request)
        self._text = ""
        self._token_ids: list[int] = []
        self._content = ""
        self.calls = 0

    @property
    def keep_special_tokens(self) -> bool:
        """Whether the parser needs special tokens in the text (its markers may be ones)."""
        return not self._request.skip_special_tokens

    def structural_tag(self, parallel_tool_calls: bool, response_schema: str | None) -> str | None:
        """The structural tag (JSON text) that guides this reply, as vLLM
        builds it; None when the parser has no structural tag."""
        from vllm.tool_parsers.structural_tag_registry import limit_to_single_tool_call
        from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
        from xgrammar import StructuralTag
        from xgrammar.structural_tag import JSONSchemaFormat, OrFormat

        request = self._request
        if response_schema is not None:
            # As vLLM does: either calls (at least one) or the JSON reply.
            request = request.model_copy(update={"tool_choice": "required"})
        strict = ToolStrictLevel.PARAMETER  # every tool's arguments follow its schema
        tag = self._parser.get_structural_tag(request, reasoning=False, strict_level=strict)
        if tag is None:
            return None
        if not parallel_tool_calls:
            limit_to_single_tool_call(tag)
        if response_schema is not None:
            reply = JSONSchemaFormat(json_schema=json.loads(response_schema))
            tag = StructuralTag(format=OrFormat(elements=[tag.format, reply]))
        return json.dumps(tag.model_dump())

    def prime(self, text: str, token_ids: list[int]) -> None:
        """Read output streamed before a continuation, emitting nothing."""
        if text or token_ids:
            self.feed(text, token_ids)

    def feed(self, text: str, token_ids: list[int] | tuple[int, ...]) -> tuple[str, list[ToolCallPart]]:
        """The content and tool-call parts ``text`` (new output) makes."""
        previous_text, previous_ids = self._text, list(self._token_ids)
        self._text += text
        self._token_ids.extend(token_ids)
        delta = self._parser.extract_tool_calls_streaming(
            previous_text, self._text, text, previous_ids, self._token_ids, list(token_ids), self._request
        )
        if delta is None:
            return "", []
        parts = [self._part(call) for call in delta.tool_calls or ()]
        for part in parts:
            self.calls = max(self.calls, part.index + 1)
        content = delta.content or ""
        self._content += content
        return content, parts

    def flush(self) -> tuple[str, list[ToolCallPart]]:
        """At the end: text the parser held back as a possible marker that
        never came, and the last call's arguments it had not streamed."""
        parts: list[ToolCallPart] = []
        if self.calls:
            rest = self._parser.get_remaining_unstreamed_args()
            if rest:
                parts.append(ToolCallPart(self.calls - 1, arguments=rest))
            return "", parts
        held = self._text[len(self._content) :] if self._text.startswith(self._content) else ""
        self._content += held
        return held, parts

    @staticmethod
    def _part(call: Any) -> ToolCallPart:
        function = call.function
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
        else:
            name = getattr(function, "name", None)
            arguments = getattr(function, "arguments", None)
        return ToolCallPart(call.index, call.id or "", name or "", arguments or "")
