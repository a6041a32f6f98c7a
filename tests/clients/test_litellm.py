"""litellm unchanged against the edge, as an OpenAI provider
(``custom_llm_provider="openai"``, ``api_base``): ``litellm.responses``
(the Responses API) and ``litellm.text_completion`` (legacy completions),
whole and streamed; the blocking calls run beside the mesh's event loop.
litellm reads its bundled model-cost map and sends no telemetry: it
reaches nothing but the edge."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.stack import DEV_KEY

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    # Warnings pydantic gives about litellm's own use of it: a ReadOnly item
    # of a TypedDict, a Responses API usage its logging replaced by a dict,
    # and a model's fields read from an instance.
    pytest.mark.filterwarnings("ignore:.*`ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_[a-z_]*' attribute on the instance:DeprecationWarning"
    ),
]

ASK = "Say something about meshes."


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    """litellm, configured to make no network calls of its own: it reads
    the cost map it ships (its setting is an environment variable, read
    on import and later)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.telemetry = False
        litellm.suppress_debug_info = True
        yield litellm


def edge(edge_url: str) -> dict[str, Any]:
    return {"api_base": edge_url, "api_key": DEV_KEY, "custom_llm_provider": "openai", "max_retries": 0}


async def test_responses_whole_and_streamed(litellm: ModuleType, edge_url: str) -> None:
    def run() -> tuple[Any, list[Any]]:
        whole = litellm.responses(model="auto", input=ASK, max_output_tokens=400, **edge(edge_url))
        stream = litellm.responses(
            model="auto", input=ASK, max_output_tokens=400, stream=True, **edge(edge_url)
        )
        return whole, list(stream)

    whole, events = await asyncio.to_thread(run)
    assert whole.id.startswith("resp_") and whole.status == "completed"
    text = whole.output[0].content[0].text
    assert text and whole.usage.output_tokens > 0
    # litellm's event types are str enums.
    kinds = [str(e.type.value) for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(
        e.delta for e, kind in zip(events, kinds, strict=True) if kind == "response.output_text.delta"
    )
    # Greedy decoding: the same reply both ways.
    assert deltas == text
    final = events[-1].response
    assert final.output[0].content[0].text == text


async def test_text_completion_whole_and_streamed(litellm: ModuleType, edge_url: str) -> None:
    def run() -> tuple[Any, list[Any]]:
        whole = litellm.text_completion(model="auto", prompt=ASK, max_tokens=12, **edge(edge_url))
        stream = litellm.text_completion(
            model="auto",
            prompt=ASK,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            **edge(edge_url),
        )
        return whole, list(stream)

    whole, chunks = await asyncio.to_thread(run)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    [choice] = whole.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert 0 < whole.usage.completion_tokens <= 12
    streamed = "".join(c.choices[0].text or "" for c in chunks if c.choices)
    assert streamed == choice.text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
