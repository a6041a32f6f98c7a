"""LangChain's ``ChatOpenAI`` (``langchain-openai``) unchanged against the
edge, on the Responses API (``use_responses_api=True``): ``invoke`` and
``stream`` (the blocking calls, beside the mesh's event loop), structured
output from a pydantic model, and a bound tool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import BaseModel, SecretStr

from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASK = "Say something about meshes."


class Forecast(BaseModel):
    city: str
    summary: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_clients() -> AsyncIterator[dict[str, Any]]:
    """The HTTP clients the models use, closed afterwards (a model's own are never closed)."""
    async with httpx.AsyncClient(timeout=30) as async_client:
        with httpx.Client(timeout=30) as client:
            yield {"http_client": client, "http_async_client": async_client}


@pytest.fixture
def chat_model(edge_url: str, http_clients: dict[str, Any]) -> Callable[..., Any]:
    """Makes a ``ChatOpenAI`` on the Responses API at the edge, with ``options``."""
    from langchain_openai import ChatOpenAI

    def make(**options: Any) -> Any:
        return ChatOpenAI(
            model="auto",
            base_url=edge_url,
            api_key=SecretStr(DEV_KEY),
            use_responses_api=True,
            max_retries=0,
            **http_clients,
            **options,
        )

    return make


async def test_invoke_and_stream_give_the_same_reply(chat_model: Callable[..., Any]) -> None:
    llm = chat_model(max_tokens=24)

    def run() -> tuple[Any, list[Any]]:
        return llm.invoke(ASK), list(llm.stream(ASK))

    whole, chunks = await asyncio.to_thread(run)
    assert whole.response_metadata["id"].startswith("resp_")
    assert whole.response_metadata["model_name"] and whole.response_metadata["status"] in (
        "completed",
        "incomplete",
    )
    assert whole.text and whole.usage_metadata["output_tokens"] > 0
    assert whole.usage_metadata["total_tokens"] == (
        whole.usage_metadata["input_tokens"] + whole.usage_metadata["output_tokens"]
    )
    assert len(chunks) > 2
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    # Greedy decoding: the same reply both ways.
    assert streamed.text == whole.text
    assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_structured_output_is_the_pydantic_model(chat_model: Callable[..., Any], method: str) -> None:
    structured = chat_model().with_structured_output(Forecast, method=method)
    forecast = await structured.ainvoke("The weather in Oslo, please.")
    assert isinstance(forecast, Forecast)


async def test_a_bound_tool_is_called(chat_model: Callable[..., Any]) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    reply = await chat_model().bind_tools([get_weather]).ainvoke("What does get_weather say about Paris?")
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    assert call["id"].startswith("call_")
