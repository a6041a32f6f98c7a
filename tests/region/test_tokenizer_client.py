"""The region's TokenizerClient: the pod's published tokenizer run in the
region gives exactly the pod's own ``Tokenize`` ids, and the pod is asked
where the region cannot tokenize."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.chat_tokenizer import HfTokenizerSpec, chat_role_name, tokenizer_response, tokenizer_spec
from llmmesh.core.errors import InvalidArgument
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.sim.vocabulary import DIGITS, PUNCTUATION, SPECIAL_TOKENS, WORDS
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.tokenizer_client import TokenizerClient, local_tokenizer
from llmmesh.v1 import common_pb2, engine_service_pb2
from tests.region.support import chat, pod_settings, tokenize

MODEL = "llmmesh-tiny"
ROLES = (
    common_pb2.CHAT_ROLE_SYSTEM,
    common_pb2.CHAT_ROLE_USER,
    common_pb2.CHAT_ROLE_ASSISTANT,
    common_pb2.CHAT_ROLE_DEVELOPER,
    common_pb2.CHAT_ROLE_TOOL,
)
# Vocabulary words and ones outside it, capitals, digits, marks, whitespace
# runs, non-ASCII text and the spelling of special tokens.
ODD_PIECES = (
    "zebra", "Über", "naïve", "日本語", "🙂", "THE", "The", "\t", "\n\n", "  ", "x1y2", "--", "<|end|>",
    "<s>", "¿", "e\u0301", "\r\n",
)  # fmt: skip


def random_text(rng: random.Random) -> str:
    vocabulary = (*WORDS, *PUNCTUATION, *DIGITS, *ODD_PIECES, *SPECIAL_TOKENS)
    parts = [rng.choice(vocabulary) for _ in range(rng.randint(0, 40))]
    return "".join(part + rng.choice(("", " ", " ", " ", "\n")) for part in parts)


def random_chat(rng: random.Random) -> list[common_pb2.ChatMessage]:
    return [
        common_pb2.ChatMessage(role=rng.choice(ROLES), content=random_text(rng))
        for _ in range(rng.randint(1, 6))
    ]


@pytest_asyncio.fixture
async def pod() -> AsyncIterator[EnginePod]:
    pod = await start_engine(pod_settings())
    try:
        yield pod
    finally:
        await pod.stop(0)


@pytest_asyncio.fixture
async def pool(pod: EnginePod) -> AsyncIterator[EnginePool]:
    pool = EnginePool([pod.address])
    try:
        await pool.check()
        yield pool
    finally:
        await pool.close()


class CallCounter:
    """Counts one RPC of a pod's stub, optionally failing it with ``code``."""

    def __init__(self, pool: EnginePool, method: str, code: grpc.StatusCode | None = None) -> None:
        self.calls = 0
        stub = pool.pods[0].stub
        real = getattr(stub, method)

        async def counted(request: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if code is not None:
                raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "faked")
            return await real(request, **kwargs)

        setattr(stub, method, counted)


@pytest.mark.asyncio
async def test_the_regions_ids_are_the_pods_own(pool: EnginePool) -> None:
    client = TokenizerClient(pool)
    pod_stub = pool.pods[0].stub
    rng = random.Random(20260611)
    chats: list[Sequence[common_pb2.ChatMessage]] = [random_chat(rng) for _ in range(150)]
    chats += [chat("system:be brief", "hello", "hi there", "and now?"), chat("")]
    for messages in chats:
        for opener in (True, False):
            reply: engine_service_pb2.TokenizeResponse = await pod_stub.Tokenize(
                engine_service_pb2.TokenizeRequest(messages=messages, add_generation_prompt=opener)
            )
            assert await client.tokenize(MODEL, messages, opener) == tuple(reply.token_ids), messages
    assert client.local_misses == client.misses == 2 * len(chats)


@pytest.mark.asyncio
async def test_the_tokenizer_is_described_once_for_concurrent_turns(pool: EnginePool) -> None:
    described = CallCounter(pool, "GetTokenizer")
    asked = CallCounter(pool, "Tokenize")
    client = TokenizerClient(pool)
    prompts = [chat(f"question {n} about the sea") for n in range(12)]
    ids = await asyncio.gather(*(client.tokenize(MODEL, p) for p in prompts))
    assert [list(i) for i in ids] == [await tokenize(pool.pods[0].stub, p) for p in prompts]
    assert (described.calls, client.local_misses) == (1, 12)
    assert asked.calls == len(prompts)  # only the comparison above asked the pod


@pytest.mark.asyncio
async def test_a_prompt_the_region_cannot_render_gets_the_pods_answer(pool: EnginePool) -> None:
    asked = CallCounter(pool, "Tokenize")
    client = TokenizerClient(pool)
    assert chat_role_name(common_pb2.CHAT_ROLE_UNSPECIFIED) == "unspecified"
    odd = [common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_UNSPECIFIED, content="hello")]
    with pytest.raises(InvalidArgument, match="is not a chat role"):
        await client.tokenize(MODEL, odd)
    assert asked.calls == 1
    # A prompt without messages is plain text to a pod: it answers that too.
    assert await client.tokenize(MODEL, []) == tuple(await tokenize(pool.pods[0].stub, []))


@pytest.mark.asyncio
async def test_a_pod_that_cannot_describe_its_tokenizer_tokenizes_every_prompt(pool: EnginePool) -> None:
    described = CallCounter(pool, "GetTokenizer", grpc.StatusCode.UNIMPLEMENTED)
    asked = CallCounter(pool, "Tokenize")
    client = TokenizerClient(pool)
    first, second = chat("hello there"), chat("hello again")
    assert await client.tokenize(MODEL, first) == tuple(await tokenize(pool.pods[0].stub, first))
    assert await client.tokenize(MODEL, second) == tuple(await tokenize(pool.pods[0].stub, second))
    assert await client.tokenize(MODEL, second) == tuple(await tokenize(pool.pods[0].stub, second))  # cached
    assert (described.calls, asked.calls, client.local_misses) == (1, 2 + 3, 0)


@pytest.mark.asyncio
async def test_an_unreachable_description_is_asked_again_later(pool: EnginePool) -> None:
    described = CallCounter(pool, "GetTokenizer", grpc.StatusCode.UNAVAILABLE)
    now = [0.0]
    client = TokenizerClient(pool, describe_retry_s=30.0, clock=lambda: now[0])
    await client.tokenize(MODEL, chat("one"))
    await client.tokenize(MODEL, chat("two"))
    assert (described.calls, client.local_misses) == (1, 0)
    now[0] = 31.0
    await client.tokenize(MODEL, chat("three"))
    assert described.calls == 2


@pytest.mark.asyncio
async def test_local_off_always_asks_the_pods(pool: EnginePool) -> None:
    described = CallCounter(pool, "GetTokenizer")
    client = TokenizerClient(pool, local=False)
    assert await client.tokenize(MODEL, chat("hello")) == tuple(
        await tokenize(pool.pods[0].stub, chat("hello"))
    )
    assert (described.calls, client.local_misses) == (0, 0)


@pytest.mark.asyncio
async def test_the_pod_describes_only_its_own_model(pool: EnginePool) -> None:
    stub = pool.pods[0].stub
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetTokenizer(engine_service_pb2.GetTokenizerRequest(model="another-model"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    described: engine_service_pb2.GetTokenizerResponse = await stub.GetTokenizer(
        engine_service_pb2.GetTokenizerRequest()
    )
    assert (described.model, described.WhichOneof("tokenizer")) == (MODEL, "pieces")


def test_a_published_hf_tokenizer_renders_as_transformers_does() -> None:
    """What a vLLM pod does in ``Tokenize`` (transformers' chat template, then
    encode without special tokens), against the region's run of what it publishes."""
    pytest.importorskip("transformers")
    from llmmesh.engine.tiny_model import SPECIAL_TOKENS as HF_SPECIAL_TOKENS
    from llmmesh.engine.tiny_model import build_hf_tokenizer
    from llmmesh.engine.vllm_engine.tokenizer_spec import hf_tokenizer_spec

    hf = build_hf_tokenizer()
    published = tokenizer_spec(tokenizer_response(MODEL, hf_tokenizer_spec(hf)))
    assert isinstance(published, HfTokenizerSpec)
    local = local_tokenizer(published)
    assert local is not None
    rng = random.Random(20260612)
    chats = [[(chat_role_name(m.role), m.content) for m in random_chat(rng)] for _ in range(150)]
    chats.append([("user", f"say {token} twice {token}") for token in HF_SPECIAL_TOKENS])
    for turns in chats:
        for opener in (True, False):
            text = hf.apply_chat_template(
                [{"role": role, "content": content} for role, content in turns],
                add_generation_prompt=opener,
                tokenize=False,
            )
            assert local.render_chat(turns, opener) == hf.encode(text, add_special_tokens=False), turns
    with pytest.raises(ValueError, match="empty chat"):
        local.render_chat([], True)
