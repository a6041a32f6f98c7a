"""Structured output, log probabilities, penalties, logit_bias, stop lists,
max_completion_tokens and cancellation through the official ``openai`` SDK
against the in-process mesh with the simulator; each asserts an observable
effect, not only acceptance."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

from llmmesh.engine.sim.tokenizer import SimTokenizer
from tests.edge.sdk import async_client
from tests.stack import DEV_KEY, Stack, running_stack
from tests.strict_models import Everything, Tree

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    """One mesh for the module's tests: none leaves anything another reads.
    Its output filter reports PII without blocking, since structured output
    of a model with an email field holds an email address."""
    async with running_stack(with_edge=True, region_overrides={"safety_report_only": "pii"}) as running:
        yield running


ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about meshes."}]
LONG: dict[str, Any] = {"max_tokens": 40, "extra_body": {"ignore_eos": True}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["a", "b"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}
PERSON_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def token_ids(completion: ChatCompletion) -> list[int]:
    """The reply's token ids, from its logprobs' tokens (one piece each)."""
    assert completion.choices[0].logprobs is not None
    tokenizer = SimTokenizer()
    ids = []
    for entry in completion.choices[0].logprobs.content or []:
        (token_id,) = tokenizer.encode(entry.token)
        ids.append(token_id)
    return ids


async def test_json_object_and_json_schema_replies_are_valid(stack: Stack) -> None:
    async with async_client(stack) as client:
        loose = await client.chat.completions.create(
            model="auto", messages=ASK, response_format={"type": "json_object"}, max_tokens=200
        )
        strict = await client.chat.completions.create(
            model="auto",
            messages=ASK,
            response_format=PERSON_FORMAT,
            max_tokens=300,
        )
        stream = await client.chat.completions.create(
            model="auto",
            messages=ASK,
            response_format=PERSON_FORMAT,
            max_tokens=300,
            stream=True,
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert isinstance(json.loads(loose.choices[0].message.content or ""), dict)
    assert loose.choices[0].finish_reason == "stop"
    for text in (strict.choices[0].message.content or "", streamed):
        jsonschema.validate(json.loads(text), PERSON)
    assert streamed == strict.choices[0].message.content


async def test_parse_fills_a_model_of_every_strict_mode_feature(stack: Stack) -> None:
    """``parse(response_format=Model)``: formats, a pattern with a length
    bound, bounds with a multiple, bounded lists, a nullable field, an enum,
    a nested and a recursive model, all valid for pydantic."""
    async with async_client(stack) as client:
        replies = await asyncio.gather(
            *(
                client.chat.completions.parse(
                    model="auto",
                    messages=ASK,
                    response_format=Everything,
                    max_tokens=2000,
                    temperature=1.0,
                    seed=seed,
                )
                for seed in range(3)
            )
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="auto",
                messages=ASK,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "odd", "schema": {"type": "object", "if": {"required": ["a"]}}},
                },
            )
    documents = set()
    for reply in replies:
        parsed = reply.choices[0].message.parsed
        assert isinstance(parsed, Everything) and reply.choices[0].finish_reason == "stop"
        assert parsed.when.tzinfo is not None and parsed.id.version == 4
        assert re.fullmatch(r"[A-Z]{2}-\d{3,5}", parsed.code) and len(parsed.code) <= 7
        assert parsed.count > 0 and parsed.count % 5 == 0 and 0 <= parsed.ratio < 1
        assert 1 <= len(parsed.numbers) <= 3 and isinstance(parsed.tree, Tree)
        documents.add(reply.choices[0].message.content)
    assert len(documents) == len(replies)
    assert refused.value.param == "response_format.json_schema.schema"
    assert "keyword 'if' at #" in refused.value.message


async def test_responses_parse_fills_the_same_model(stack: Stack) -> None:
    """``responses.parse(text_format=Model)`` over the Responses API: the
    same strict-mode model, valid for pydantic."""
    async with async_client(stack) as client:
        reply = await client.responses.parse(
            model="auto", input="Say something about meshes.", text_format=Everything, max_output_tokens=2000
        )
    parsed = reply.output_parsed
    assert isinstance(parsed, Everything) and reply.status == "completed"
    assert parsed.when.tzinfo is not None and parsed.id.version == 4
    assert parsed.count > 0 and parsed.count % 5 == 0 and isinstance(parsed.tree, Tree)


async def test_logprobs_and_top_logprobs_whole_and_streamed(stack: Stack) -> None:
    async with async_client(stack) as client:
        whole = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, top_logprobs=3, max_tokens=12
        )
        stream = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, top_logprobs=3, max_tokens=12, stream=True
        )
        chunks = [c async for c in stream]
        plain = await client.chat.completions.create(model="auto", messages=ASK, max_tokens=12)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert whole.usage is not None and len(logprobs.content) == whole.usage.completion_tokens
    assert "".join(e.token for e in logprobs.content) == whole.choices[0].message.content
    for entry in logprobs.content:
        assert entry.logprob <= 0 and bytes(entry.bytes or []) == entry.token.encode()
        assert len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in logprobs.content]
    assert plain.choices[0].logprobs is None


async def test_a_logit_bias_of_minus_100_bans_a_token(stack: Stack) -> None:
    async with async_client(stack) as client:
        base = await client.chat.completions.create(model="auto", messages=ASK, logprobs=True, **LONG)
        ids = token_ids(base)
        banned = Counter(ids).most_common(1)[0][0]
        biased = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, logit_bias={str(banned): -100}, **LONG
        )
        favoured = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, logit_bias={str(banned): 100}, **LONG
        )
    assert banned not in token_ids(biased)
    assert token_ids(biased) != ids
    assert Counter(token_ids(favoured))[banned] > Counter(ids)[banned]


async def test_penalties_make_a_reply_less_repetitive(stack: Stack) -> None:
    async with async_client(stack) as client:
        base = await client.chat.completions.create(model="auto", messages=ASK, logprobs=True, **LONG)
        frequency = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, frequency_penalty=2.0, **LONG
        )
        presence = await client.chat.completions.create(
            model="auto", messages=ASK, logprobs=True, presence_penalty=2.0, **LONG
        )
    repeats = {
        name: Counter(token_ids(c)).most_common(1)[0][1]
        for name, c in (("base", base), ("frequency", frequency), ("presence", presence))
    }
    distinct = {name: len(set(token_ids(c))) for name, c in (("base", base), ("presence", presence))}
    assert repeats["frequency"] < repeats["base"]
    assert repeats["presence"] < repeats["base"]
    assert distinct["presence"] > distinct["base"]


async def test_a_stop_list_ends_the_reply_before_the_first_stop(stack: Stack) -> None:
    async with async_client(stack) as client:
        base = await client.chat.completions.create(model="auto", messages=ASK, **LONG)
        text = base.choices[0].message.content or ""
        words = text.split()
        stops = [f" {words[8]}", f" {words[5]}"]
        stopped = await client.chat.completions.create(model="auto", messages=ASK, stop=stops, **LONG)
    cut = min(text.index(s) for s in stops)
    assert stopped.choices[0].message.content == text[:cut]
    assert stopped.choices[0].finish_reason == "stop"


async def test_max_completion_tokens_bounds_the_reply_over_max_tokens(stack: Stack) -> None:
    async with async_client(stack) as client:
        completion = await client.chat.completions.create(
            model="auto",
            messages=ASK,
            max_completion_tokens=5,
            max_tokens=30,
            extra_body={"ignore_eos": True},
        )
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.choices[0].finish_reason == "length"


@pytest_asyncio.fixture(loop_scope="module")
async def slow() -> AsyncIterator[Stack]:
    async with running_stack(with_edge=True, sim_inter_token_s=0.05) as running:
        yield running


async def test_a_cancelled_stream_ends_with_finish_reason_cancelled_and_the_billed_usage(slow: Stack) -> None:
    assert slow.edge is not None
    async with async_client(slow) as client, httpx.AsyncClient(base_url=slow.edge.url, timeout=30) as http:
        stream = await client.chat.completions.create(
            model="auto", messages=ASK, stream=True, max_tokens=500, extra_body={"ignore_eos": True}
        )
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 3:
                cancel = await http.post(
                    f"/v1/streams/{chunk.id}/cancel", headers={"Authorization": f"Bearer {DEV_KEY}"}
                )
                assert cancel.json()["status"] == "cancelled"
    finish = chunks[-1]
    # The SDK's type lists OpenAI's reasons; the mesh's own arrives as it is.
    assert str(finish.choices[0].finish_reason) == "cancelled"
    assert finish.usage is not None
    streamed = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert 2 <= finish.usage.completion_tokens < 500
    assert finish.usage.completion_tokens >= streamed
