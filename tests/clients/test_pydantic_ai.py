"""pydantic-ai (``pydantic-ai-slim[openai]``) unchanged against the edge:
an ``Agent`` on ``OpenAIResponsesModel`` (the ``openai-responses:`` model)
and on ``OpenAIChatModel`` (``openai:``, chat completions), each through
an ``OpenAIProvider`` pointed at the edge, with a function tool and a
pydantic output type: as a tool call (the library's default, which sends
``tool_choice: required``) and as the API's own structured output
(``NativeOutput``: ``text.format`` / ``response_format`` json_schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from pydantic import BaseModel

from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODELS = ("OpenAIResponsesModel", "OpenAIChatModel")
# The id prefix of each model class's API: /v1/responses and /v1/chat/completions.
ID_PREFIX = {"OpenAIResponsesModel": "resp_", "OpenAIChatModel": "chatcmpl-"}


class Forecast(BaseModel):
    city: str
    summary: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provider(edge_url: str) -> AsyncIterator[Any]:
    """An ``OpenAIProvider`` at the edge, over an HTTP client closed afterwards."""
    from pydantic_ai.providers.openai import OpenAIProvider

    async with httpx2.AsyncClient(timeout=30) as http:
        yield OpenAIProvider(base_url=edge_url, api_key=DEV_KEY, http_client=http)


def forecaster(provider: Any, model_class: str, calls: list[str], *, native: bool) -> Any:
    """An agent on ``model_class`` with a ``get_weather`` tool that records the cities it is asked for."""
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models import openai as models

    model = getattr(models, model_class)("auto", provider=provider)
    agent = Agent(
        model,
        output_type=NativeOutput(Forecast) if native else Forecast,
        instructions="Answer with the city and a one-line summary.",
        retries=0,
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny, 21 C"

    return agent


def part_kinds(result: Any) -> list[list[str]]:
    return [[part.part_kind for part in message.parts] for message in result.all_messages()]


@pytest.mark.parametrize("model_class", MODELS)
async def test_native_output_after_a_tool_call(provider: Any, model_class: str) -> None:
    calls: list[str] = []
    agent = forecaster(provider, model_class, calls, native=True)
    result = await agent.run("What does get_weather say about Paris?")
    assert isinstance(result.output, Forecast), result.output
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert part_kinds(result) == [
        ["user-prompt"],
        ["tool-call"],
        ["tool-return"],
        ["text"],
    ]
    usage = result.usage
    assert usage.requests == 2 and usage.output_tokens > 0
    replies = [m for m in result.all_messages() if m.kind == "response"]
    assert all(r.provider_response_id.startswith(ID_PREFIX[model_class]) for r in replies)


@pytest.mark.parametrize("model_class", MODELS)
async def test_tool_output_is_the_default(provider: Any, model_class: str) -> None:
    calls: list[str] = []
    agent = forecaster(provider, model_class, calls, native=False)
    result = await agent.run("How is the sky over Oslo?")
    assert isinstance(result.output, Forecast), result.output
    # The output came as a call of the library's own output tool.
    returned = [p for m in result.all_messages() for p in m.parts if p.part_kind == "tool-call"]
    assert "final_result" in [p.tool_name for p in returned]


@pytest.mark.parametrize("model_class", MODELS)
async def test_a_streamed_run_gives_the_output_type(provider: Any, model_class: str) -> None:
    calls: list[str] = []
    agent = forecaster(provider, model_class, calls, native=True)
    async with agent.run_stream("What does get_weather say about Lima?") as run:
        partial = [output async for output in run.stream_output(debounce_by=None)]
        output = await run.get_output()
    assert isinstance(output, Forecast) and len(calls) == 1
    assert partial and partial[-1] == output
