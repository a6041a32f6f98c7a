"""``tool_choice`` auto on vLLM: the model decides, in its own tool-call
syntax, and vLLM's tool parser for that syntax finds the calls in the
streamed text (as ``vllm serve --tool-call-parser NAME`` does).

A model can decide to call only if its chat template shows it the tools
(the region renders them with the template a pod publishes), and the pod
needs the parser that reads the syntax the template teaches. Both are read
from the served chat template (:func:`tool_parser_for_template`): a
template that renders ``tools`` and writes calls as ``<tool_call>`` JSON
``</tool_call>`` (Hermes, Qwen and most ChatML models) gets vLLM's
``hermes`` parser. A pod whose template has no such syntax refuses auto
(``INVALID_ARGUMENT``, param ``tool_choice``) rather than answer as if
no tools were given; required and named choices work with any template.

vLLM's parsers and its OpenAI request types are imported on the first
auto request, so plain turns and pod startup never pay for them.
"""

from __future__ import annotations

import json
from typing import Any

from engine.backend import ToolCallPart, ToolSpec
from llmmesh.errors import InvalidArgument, Reason

# The call markers of a template's tool-call syntax, and vLLM's parser for it.
_PARSERS_BY_MARKER = (("<tool_call>", "hermes"),)


def tool_parser_for_template(template: str | None) -> str | None:
    """vLLM's tool-parser name for the syntax ``template`` teaches, None
    when it renders no tools or writes calls in no syntax known here."""
    if not template or "tools" not in template:
        return None
    for marker, parser in _PARSERS_BY_MARKER:
        if marker in template:
            return parser
    return None


def refuse_auto() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_SAMPLING,
        "tool_choice 'auto' needs a model whose chat template shows it the tools and a tool-call "
        "syntax this pod can parse; this model has neither, use tool_choice 'required' or a named tool",
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
