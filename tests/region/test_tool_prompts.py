"""Prompts with tools as the region tokenizes them: the simulator's tokenizer
run in the region and a pod asked to tokenize agree; a chat template that
renders tools gets them as transformers takes them, one that does not gets
them as text; and a template with tools the region cannot run is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from llmmesh.core.chat_tokenizer import HfTokenizerSpec, tokenizer_response
from llmmesh.core.errors import FailedPrecondition
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.hf_chat_tokenizer import HfChatTokenizer
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.region.turn.prompt_render import plain_turns, template_messages, template_tools
from llmmesh.v1 import common_pb2
from tests.region.support import pod_settings

MODEL = "llmmesh-tiny"
USER, ASSISTANT, TOOL = common_pb2.CHAT_ROLE_USER, common_pb2.CHAT_ROLE_ASSISTANT, common_pb2.CHAT_ROLE_TOOL
WEATHER = common_pb2.ToolDefinition(
    name="get_weather",
    description="The weather in a city now.",
    parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}',
)
CALL = common_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
CHAT = [
    common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content="Be brief."),
    common_pb2.ChatMessage(role=USER, content="Weather in Oslo?"),
    common_pb2.ChatMessage(role=ASSISTANT, content="Let me look.", tool_calls=[CALL]),
    common_pb2.ChatMessage(role=TOOL, content="12 C", tool_call_id="call_1"),
]
# A Qwen-like template that renders tools, calls and tool answers.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}\n<tool_call>"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest_asyncio.fixture
async def pool() -> AsyncIterator[EnginePool]:
    pod: EnginePod = await start_engine(pod_settings())
    pool = EnginePool([pod.address])
    try:
        await pool.check()
        yield pool
    finally:
        await pool.close()
        await pod.stop(0)


@pytest.mark.asyncio
async def test_the_region_and_a_pod_render_tools_alike(pool: EnginePool) -> None:
    local, asked = TokenizerClient(pool), TokenizerClient(pool, local=False)
    for messages, tools in ((CHAT, [WEATHER]), (CHAT, []), (CHAT[:2], [WEATHER])):
        ids = await local.tokenize(MODEL, messages, tools=tools)
        assert ids == await asked.tokenize(MODEL, messages, tools=tools)
        assert local.local_misses == local.misses
    # Tools are prompt tokens: the same chat with them is longer, and cached apart.
    assert len(await local.tokenize(MODEL, CHAT[:2], tools=[WEATHER])) > len(
        await local.tokenize(MODEL, CHAT[:2])
    )


def hf_spec(template: str) -> tuple[Any, HfTokenizerSpec]:
    pytest.importorskip("transformers")
    from llmmesh.engine.tiny_model import build_hf_tokenizer
    from llmmesh.engine.vllm_engine.tokenizer_spec import hf_tokenizer_spec

    hf = build_hf_tokenizer()
    hf.chat_template = template
    spec = hf_tokenizer_spec(hf)
    assert spec is not None
    return hf, spec


def test_a_template_with_tools_gets_them_as_transformers_takes_them() -> None:
    hf, spec = hf_spec(TOOLS_TEMPLATE)
    local = HfChatTokenizer(spec)
    assert local.renders_tools
    messages, tools = template_messages(CHAT), template_tools([WEATHER])
    text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert "get_weather" in text and "<tool_call>" in text
    assert local.render_messages(messages, tools, True) == hf.encode(text, add_special_tokens=False)


def test_a_template_without_tools_gets_them_as_text() -> None:
    from llmmesh.engine.tiny_model import CHAT_TEMPLATE

    hf, spec = hf_spec(CHAT_TEMPLATE)
    local = HfChatTokenizer(spec)
    assert not local.renders_tools
    turns = plain_turns(CHAT, [WEATHER])
    text = hf.apply_chat_template(
        [{"role": role, "content": content} for role, content in turns],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert '"name": "get_weather"' in text and '"tool_call_id": "call_1"' in text
    assert local.render_chat(turns, True) == hf.encode(text, add_special_tokens=False)


@pytest.mark.asyncio
async def test_tools_for_a_template_the_region_cannot_run_are_refused(pool: EnginePool) -> None:
    stub = pool.pods[0].stub
    # A pod publishing a tool-rendering template whose tokenizer this region cannot load.
    published = tokenizer_response(MODEL, HfTokenizerSpec("not a tokenizer", TOOLS_TEMPLATE, {}))

    async def describe(request: Any, **kwargs: Any) -> Any:
        return published

    stub.GetTokenizer = describe
    client = TokenizerClient(pool)
    with pytest.raises(FailedPrecondition) as info:
        await client.tokenize(MODEL, CHAT[:2], tools=[WEATHER])
    assert (info.value.code, info.value.metadata["param"]) == (grpc.StatusCode.FAILED_PRECONDITION, "tools")
    # Without tools, the pod answers as ever.
    assert await client.tokenize(MODEL, CHAT[:2])
