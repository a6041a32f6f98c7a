"""The OpenAI Agents SDK (``openai-agents``) unchanged against the edge:
an ``Agent`` on its default model type, the Responses API
(``OpenAIResponsesModel`` over the client given to
``set_default_openai_client``), with one function tool and a pydantic
``output_type``. The simulator calls a tool when the last user message
names it, or when ``tool_choice`` is ``required``, and answers a tool's
result with a JSON instance of the output schema, so each run is a whole
agent loop: a call, its output, the final answer. Tracing is off: the SDK
reaches nothing but the edge."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from pydantic import BaseModel

from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Forecast(BaseModel):
    city: str
    summary: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent_sdk(edge_url: str) -> AsyncIterator[None]:
    """The SDK's default client is the edge's; tracing is off."""
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    async with AsyncOpenAI(base_url=edge_url, api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        agents.set_default_openai_client(client, use_for_tracing=False)
        yield


def forecaster(calls: list[str], **settings: Any) -> Any:
    """An agent with a ``get_weather`` tool that records the cities it is asked for."""
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny, 21 C"

    return Agent(
        name="forecaster",
        instructions="Answer with the city and a one-line summary.",
        model="auto",
        tools=[get_weather],
        output_type=Forecast,
        model_settings=ModelSettings(**settings),
    )


def item_kinds(result: Any) -> list[str]:
    return [type(item).__name__ for item in result.new_items]


@pytest.mark.usefixtures("agent_sdk")
async def test_an_agent_calls_its_tool_and_returns_its_output_type() -> None:
    from agents import Runner

    calls: list[str] = []
    result = await Runner.run(forecaster(calls), "What does get_weather say about Paris?")
    assert isinstance(result.final_output, Forecast), result.final_output
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert item_kinds(result) == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    # Two Responses API turns: the call, then the answer to its output.
    assert [(r.response_id or "")[:5] for r in result.raw_responses] == ["resp_", "resp_"]
    assert all(r.usage.output_tokens > 0 for r in result.raw_responses)
    # The final output is the last reply's text, a JSON instance of the output type.
    [message] = result.raw_responses[-1].output
    assert isinstance(message, ResponseOutputMessage)
    [text] = message.content
    assert isinstance(text, ResponseOutputText)
    assert Forecast.model_validate_json(text.text) == result.final_output


@pytest.mark.usefixtures("agent_sdk")
async def test_tool_choice_required_forces_the_call() -> None:
    from agents import Runner

    calls: list[str] = []
    # The prompt does not name the tool: only tool_choice makes the model call it.
    agent = forecaster(calls, tool_choice="required", parallel_tool_calls=False)
    result = await Runner.run(agent, "How is the sky over Oslo?")
    assert isinstance(result.final_output, Forecast)
    assert len(calls) == 1
    assert item_kinds(result) == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    unforced = await Runner.run(forecaster(calls), "How is the sky over Oslo?")
    assert len(calls) == 1 and item_kinds(unforced) == ["MessageOutputItem"]


@pytest.mark.usefixtures("agent_sdk")
async def test_a_streamed_run_reports_its_items_and_output() -> None:
    from agents import Runner

    calls: list[str] = []
    run = Runner.run_streamed(forecaster(calls), "What does get_weather say about Lima?")
    kinds = [event.type async for event in run.stream_events()]
    assert isinstance(run.final_output, Forecast) and len(calls) == 1
    assert {"raw_response_event", "run_item_stream_event"} <= set(kinds)
    assert item_kinds(run) == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
