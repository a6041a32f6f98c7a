"""Chat prompts with tools, rendered the way the engine's tokenizer takes them.

Tool definitions are prompt text: they reach the model and count as input
tokens (billing, TPM, the context window), so the region renders them into
the prompt it tokenizes and sends to the pod. Two renderings, one per kind
of tokenizer a pod publishes:

- A Hugging Face chat template gets what transformers' ``apply_chat_template``
  gets from vLLM's OpenAI server: ``tools`` as a list of
  ``{"type": "function", "function": {name, description, parameters}}``,
  an assistant message's ``tool_calls`` as
  ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
  the arguments parsed into an object where they are JSON (as vLLM does,
  templates index into them), and a tool message's ``tool_call_id``
  (:func:`template_messages`, :func:`template_tools`).
- The simulator's role-marker tokenizer renders plain ``(role, content)``
  turns, so :func:`plain_turns` writes the tool parts as JSON text: the
  tools as one system turn after the leading system (and developer)
  messages, ``# Tools`` and one JSON object per line with the function's
  name, description and parameters; an assistant message's calls as lines
  ``{"tool_call": {"id", "name", "arguments"}}`` after its content; a tool
  message as ``{"tool_call_id", "content"}``. A prompt without tool parts
  renders exactly as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmmesh.core.chat_tokenizer import chat_role_name
from llmmesh.v1 import common_pb2

TOOLS_HEADER = "# Tools\nFunctions you may call, one JSON object each (name, description, parameters):"
_LEADING_ROLES = frozenset({common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_DEVELOPER})


def has_tool_parts(
    messages: Sequence[common_pb2.ChatMessage], tools: Sequence[common_pb2.ToolDefinition]
) -> bool:
    """Whether rendering the prompt involves tools at all."""
    return bool(tools) or any(m.tool_calls or m.tool_call_id for m in messages)


def _json_value(text: str) -> Any:
    """JSON text as its value; text that is not JSON stays a string."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def tool_function(tool: common_pb2.ToolDefinition) -> dict[str, Any]:
    """A tool as OpenAI's ``function`` object (parameters as a value)."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = (
        _json_value(tool.parameters_json) if tool.parameters_json else {"type": "object", "properties": {}}
    )
    return function


def plain_turns(
    messages: Sequence[common_pb2.ChatMessage], tools: Sequence[common_pb2.ToolDefinition] = ()
) -> list[tuple[str, str]]:
    """The prompt as ``(role, content)`` turns for a role-marker tokenizer; see the module docstring."""
    turns: list[tuple[str, str]] = []
    lead = 0
    while lead < len(messages) and messages[lead].role in _LEADING_ROLES:
        lead += 1
    for position, message in enumerate(messages):
        if position == lead and tools:
            turns.append(("system", tools_text(tools)))
        turns.append((chat_role_name(message.role), plain_content(message)))
    if lead == len(messages) and tools:
        turns.append(("system", tools_text(tools)))
    return turns


def tools_text(tools: Sequence[common_pb2.ToolDefinition]) -> str:
    """The tools' system turn of :func:`plain_turns`."""
    return "\n".join([TOOLS_HEADER, *(_dumps(tool_function(tool)) for tool in tools)])


def plain_content(message: common_pb2.ChatMessage) -> str:
    """A message's content with its tool parts written as JSON."""
    if message.tool_call_id:
        return _dumps({"tool_call_id": message.tool_call_id, "content": message.content})
    if not message.tool_calls:
        return message.content
    calls = [
        _dumps({"tool_call": {"id": c.id, "name": c.name, "arguments": _json_value(c.arguments)}})
        for c in message.tool_calls
    ]
    return "\n".join([message.content, *calls] if message.content else calls)


def template_messages(messages: Sequence[common_pb2.ChatMessage]) -> list[dict[str, Any]]:
    """The messages as a chat template reads them; see the module docstring."""
    rendered: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any] = {"role": chat_role_name(message.role), "content": message.content}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _json_value(call.arguments)},
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        rendered.append(entry)
    return rendered


def template_tools(tools: Sequence[common_pb2.ToolDefinition]) -> list[dict[str, Any]] | None:
    """The tools as a chat template reads them; None for none (templates test ``tools is not none``)."""
    return [{"type": "function", "function": tool_function(tool)} for tool in tools] or None
