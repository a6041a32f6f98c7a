"""The official ``openai`` SDK against the edge, sync and async: completions
streamed and whole, ``include_usage``, and errors as its exception classes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from llmmesh.globalplane.tiers import TenantTier
from tests.edge.sdk import async_client, sync_client
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about meshes."}]


def check_chunks(chunks: list[ChatCompletionChunk], with_usage: bool) -> str:
    """The streamed text, after checking the chunks' conventions."""
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    choice_chunks = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in choice_chunks[:-1]] == [None] * (len(choice_chunks) - 1)
    assert choice_chunks[-1].choices[0].finish_reason in ("stop", "length")
    if with_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens > 0
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.choices for c in chunks)
    return "".join(c.choices[0].delta.content or "" for c in choice_chunks)


async def test_async_whole_and_streamed(stack: Stack) -> None:
    client = async_client(stack)
    whole = await client.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=16)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    stream = await client.chat.completions.create(
        model="auto", messages=MESSAGES, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    # Greedy decoding: the same reply both ways.
    assert check_chunks(chunks, with_usage=True) == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    await client.close()


async def test_sync_whole_and_streamed(stack: Stack) -> None:
    def run() -> tuple[str, str]:
        with sync_client(stack) as client:
            whole = client.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=16)
            chunks = list(
                client.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=16, stream=True)
            )
        return whole.choices[0].message.content or "", check_chunks(chunks, with_usage=False)

    # The mesh runs in this event loop; the blocking client runs beside it.
    whole, streamed = await asyncio.to_thread(run)
    assert whole and streamed == whole


async def test_sdk_raw_response_has_the_mesh_headers(stack: Stack) -> None:
    client = async_client(stack)
    raw = await client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=4
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"] == completion.id
    assert raw.headers["x-llmmesh-region"] == "us-east"
    await client.close()


async def new_key(stack: Stack, zone: str = "us", **limits: Any) -> str:
    book = stack.global_plane.tenants
    tenant = await book.create_tenant(f"t-{uuid.uuid4().hex[:10]}", zone, TenantTier.PRO, **limits)
    _, secret = await book.create_api_key(tenant.id)
    await stack.region.policy.refresh()
    return secret


async def test_errors_are_the_sdk_exception_classes(stack: Stack) -> None:
    client = async_client(stack)
    async with async_client(stack, "sk-wrong") as wrong:
        with pytest.raises(openai.AuthenticationError) as unauthenticated:
            await wrong.chat.completions.create(model="auto", messages=MESSAGES)
    assert unauthenticated.value.status_code == 401 and unauthenticated.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=0)
    assert bad.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="no-such-model", messages=MESSAGES, stream=True)
    assert unknown.value.code == "model_not_found"
    # A zone with no region refuses rather than sending the prompt elsewhere.
    elsewhere = await new_key(stack, zone="eu")
    async with async_client(stack, elsewhere) as foreign:
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await foreign.chat.completions.create(model="auto", messages=MESSAGES)
    assert denied.value.code == "no_region_in_zone"
    await client.close()


async def test_a_rate_limit_is_a_rate_limit_error_with_retry_after(stack: Stack) -> None:
    limited = async_client(stack, await new_key(stack, rpm_limit=1))
    await limited.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as refused:
        await limited.chat.completions.create(model="auto", messages=MESSAGES, max_tokens=2, stream=True)
    assert refused.value.code == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) >= 1
    await limited.close()


async def test_sync_errors_are_the_sdk_exception_classes(stack: Stack) -> None:
    def run() -> None:
        with sync_client(stack, "sk-wrong") as client, pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="auto", messages=MESSAGES)
        with sync_client(stack) as client, pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="auto", messages=[], stream=True)

    await asyncio.to_thread(run)


async def test_an_error_mid_stream_raises_from_the_sdk_stream() -> None:
    async with running_stack(with_edge=True, sim_error_rate=1.0) as stack:
        client = async_client(stack)
        stream = await client.chat.completions.create(model="auto", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError) as failed:
            async for _ in stream:
                pass
        assert "injected fault" in failed.value.message
        await client.close()


async def test_concurrent_turns_of_an_edge_share_one_session_stream_to_the_region(stack: Stack) -> None:
    client = async_client(stack)

    async def ask() -> str:
        stream = await client.chat.completions.create(
            model="auto", messages=MESSAGES, stream=True, max_tokens=40, extra_body={"ignore_eos": True}
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    replies = await asyncio.gather(*(ask() for _ in range(4)))
    assert all(replies)
    assert stack.region.sessions.streams == 1
    await client.close()
