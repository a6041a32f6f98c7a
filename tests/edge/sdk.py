"""The official ``openai`` SDK pointed at a test mesh's edge, and the
function tools the edge tests offer it."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionToolParam

from tests.stack import DEV_KEY, Stack


def base_url(stack: Stack) -> str:
    assert stack.edge is not None
    return f"{stack.edge.url}/v1"


def async_client(stack: Stack, key: str = DEV_KEY) -> openai.AsyncOpenAI:
    # No retries: each test sees the first answer.
    return openai.AsyncOpenAI(base_url=base_url(stack), api_key=key, max_retries=0, timeout=30)


def sync_client(stack: Stack, key: str = DEV_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(stack), api_key=key, max_retries=0, timeout=30)


def function_tool(
    name: str, parameters: dict[str, Any], strict: bool | None = None
) -> ChatCompletionToolParam:
    """A ``tools`` entry offering function ``name`` with JSON Schema ``parameters``."""
    tool: ChatCompletionToolParam = {"type": "function", "function": {"name": name, "parameters": parameters}}
    if strict is not None:
        tool["function"]["strict"] = strict
    return tool


def object_schema(**properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema object of ``properties``, every one required."""
    return {"type": "object", "properties": properties, "required": list(properties)}
