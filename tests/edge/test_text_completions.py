"""``POST /v1/completions`` (legacy text completions) driven by the
official ``openai`` SDK's ``client.completions.create``: whole and
streamed, ``echo``, a list prompt, legacy ``logprobs``, and the refusals
that name their parameter. One mesh for the module: no test reads what
another leaves."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from llmmesh.edge.text_chunks import TextChunkStream, legacy_logprobs
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.edge.sdk import async_client
from tests.edge.sse import parse_events
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")
PROMPT = "Once upon a time in a mesh,"
AUTH = {"authorization": f"Bearer {DEV_KEY}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(shared_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = async_client(shared_stack)
    yield sdk
    await sdk.close()


async def test_a_whole_completion_is_a_text_completion(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="auto", prompt=PROMPT, max_tokens=12, seed=7, user="u-1")
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    [choice] = whole.choices
    assert choice.index == 0 and choice.text and choice.logprobs is None
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


async def test_a_streamed_completion_matches_the_whole_one(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="auto", prompt=PROMPT, max_tokens=12, seed=3)
    stream = await client.completions.create(
        model="auto",
        prompt=PROMPT,
        max_tokens=12,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("cmpl-")
    with_choices = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in with_choices[:-1]] == [None] * (len(with_choices) - 1)
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert "".join(c.choices[0].text for c in with_choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert whole.usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_echo_puts_the_prompt_before_the_text(client: openai.AsyncOpenAI) -> None:
    plain = await client.completions.create(model="auto", prompt=PROMPT, max_tokens=8, seed=5)
    echoed = await client.completions.create(model="auto", prompt=PROMPT, max_tokens=8, seed=5, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    stream = await client.completions.create(
        model="auto", prompt=PROMPT, max_tokens=8, seed=5, echo=True, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text


async def test_a_list_prompt_has_a_choice_per_prompt(client: openai.AsyncOpenAI) -> None:
    one = await client.completions.create(model="auto", prompt=["Hello there"], max_tokens=6, seed=1)
    assert len(one.choices) == 1 and one.choices[0].text
    other = await client.completions.create(model="auto", prompt="Tell me a fact", max_tokens=6, seed=1)
    both = await client.completions.create(
        model="auto", prompt=["Hello there", "Tell me a fact"], max_tokens=6, seed=1
    )
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [one.choices[0].text, other.choices[0].text]
    assert both.usage is not None and one.usage is not None and other.usage is not None
    assert both.usage.completion_tokens == one.usage.completion_tokens + other.usage.completion_tokens


async def test_logprobs_come_in_the_legacy_shape(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="auto", prompt=PROMPT, max_tokens=6, logprobs=2)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.text_offset
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert logprobs.text_offset[0] == 0 and len(logprobs.text_offset) == len(logprobs.tokens)
    assert logprobs.top_logprobs is not None and all(len(top) <= 2 for top in logprobs.top_logprobs)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": " the end."}, "suffix"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True, "logprobs": 1}, "logprobs"),
        ({"prompt": ["a", "b"], "stream": True}, "prompt"),
        ({"temperature": 3.0}, "temperature"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ],
)
async def test_what_the_mesh_cannot_honour_is_refused_by_name(
    client: openai.AsyncOpenAI, extra: dict[str, object], param: str
) -> None:
    kwargs: dict[str, object] = {"model": "auto", "prompt": PROMPT, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(**kwargs)  # type: ignore[call-overload]
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict) and body["param"] == param


async def test_vllm_bench_serve_body_is_served(shared_http: httpx.AsyncClient) -> None:
    # What `vllm bench serve` (its openai backend) sends for a random prompt.
    body = {
        "model": "auto",
        "prompt": PROMPT,
        "repetition_penalty": 1.0,
        "max_tokens": 7,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    resp = await shared_http.post("/v1/completions", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    chunks = [e.json() for e in parse_events(resp.text) if e.data != "[DONE]"]
    assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [7]


async def test_the_default_stream_is_data_lines_only(shared_http: httpx.AsyncClient) -> None:
    body = {"model": "auto", "prompt": PROMPT, "max_tokens": 6, "stream": True}
    resp = await shared_http.post("/v1/completions", json=body, headers=AUTH)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert "id:" not in [line[:3] for line in resp.text.splitlines()]
    assert resp.text.endswith("data: [DONE]\n\n")
    resumed = await shared_http.get(
        f"/v1/streams/{resp.headers['x-request-id']}", params={"starting_after": "0"}, headers=AUTH
    )
    assert [e.data for e in parse_events(resumed.text)] == [e.data for e in parse_events(resp.text)][1:]


async def test_stream_events_count_from_zero_and_offsets_run_on() -> None:
    frames = TextChunkStream("cmpl-1", 1, "m", include_usage=False, echo="Hi", logprobs=True)
    first = frames.opening()
    assert first is not None and first.event_id == 0
    entry = common_pb2.TokenLogprob(token=" yo", logprob=-0.5)
    delta = frames.delta(chat_service_pb2.ChatDelta(sequence=1, text=" yo", logprobs=[entry]))
    assert delta.event_id == 1 and b'"text_offset":[2]' in delta.frame
    assert frames.finish(common_pb2.FINISH_REASON_STOP).event_id == 2
    assert legacy_logprobs([entry, entry], 4)["text_offset"] == [4, 7]
