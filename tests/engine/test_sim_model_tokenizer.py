"""The simulator counting prompts with the served model's tokenizer
(``model_path``): the ids the region computes from what the pod publishes,
the usage it reports, and the prompt it reads for an auto tool choice."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmmesh.core.chat_tokenizer import HfTokenizerSpec, tokenizer_response, tokenizer_spec
from llmmesh.engine.backend import (
    ChatTurn,
    GenerationRequest,
    SamplingOptions,
    ToolChoiceMode,
    ToolChoiceSpec,
)
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.model_tokenizer import prompt_tokenizer_of
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.region.tokenizer_client import local_tokenizer
from tests.engine.support import FAST, collect

# Words outside the simulator's vocabulary fall back to one piece per byte;
# the model's BPE tokenizer splits them into a few subwords.
PROMPT = (
    "Please summarize the quarterly financial statement: revenue increased seventeen percent "
    "year-over-year, and management anticipates continued profitability."
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding llmmesh-tiny's tokenizer and chat template (no weights)."""
    from llmmesh.engine.tiny_model import build_hf_tokenizer

    path = tmp_path_factory.mktemp("llmmesh-tiny")
    build_hf_tokenizer().save_pretrained(path)
    return path


@pytest.mark.asyncio
async def test_prompt_counts_are_the_models_and_the_region_gets_the_same_ids(model_dir: Path) -> None:
    backend = SimBackend(dataclasses.replace(FAST, context_window=4096, model_path=str(model_dir)))
    await backend.start()
    try:
        turns = [ChatTurn("system", "Be brief."), ChatTurn("user", PROMPT)]
        ids = await backend.tokenize(turns, True)
        # The region runs what the pod publishes and must get the pod's ids:
        # the router hashes its KV blocks from them.
        spec = tokenizer_spec(tokenizer_response("llmmesh-tiny", backend.tokenizer_spec()))
        assert isinstance(spec, HfTokenizerSpec)
        region = local_tokenizer(spec)
        assert region is not None
        assert region.render_chat([(t.role, t.content) for t in turns], True) == ids
        own = SimTokenizer().render_chat([(t.role, t.content) for t in turns], True)
        assert len(ids) < 0.7 * len(own)  # the simulator's byte fallback counts far more

        request = GenerationRequest("r1", tuple(ids), SamplingOptions(max_tokens=8))
        generation = await collect(backend, request)
        assert generation.started is not None and generation.finished is not None
        assert generation.started.prompt_tokens == generation.finished.prompt_tokens == len(ids)
        again = await collect(backend, dataclasses.replace(request, request_id="r2"))
        assert again.finished is not None
        assert again.finished.cached_prompt_tokens == len(ids) // FAST.block_size * FAST.block_size
        assert again.token_ids == generation.token_ids  # still deterministic
        assert backend.info().vocab_size >= len(region.render_chat([("user", "x")], False))
    finally:
        await backend.close()


def test_the_last_user_message_is_read_through_the_models_template(model_dir: Path) -> None:
    prompts = prompt_tokenizer_of(str(model_dir))
    assert prompts is not None
    chat = prompts.render_chat(
        [("system", "use get_time"), ("user", "call get_weather"), ("assistant", "ok")], True
    )
    assert prompts.last_user_message(chat) == "call get_weather"
    answered = prompts.render_chat([("user", "call get_weather"), ("tool", "sunny")], True)
    assert prompts.last_user_message(answered) is None
    assert prompts.last_user_message(prompts.encode_prompt("plain get_weather")) == "plain get_weather"


@pytest.mark.asyncio
async def test_auto_tool_choice_follows_the_user_message_under_the_models_tokenizer(model_dir: Path) -> None:
    from llmmesh.engine.backend import ToolSpec

    backend = SimBackend(dataclasses.replace(FAST, context_window=4096, model_path=str(model_dir)))
    await backend.start()
    try:
        tools = (
            ToolSpec("get_weather", "", '{"type": "object"}'),
            ToolSpec("get_time", "", '{"type": "object"}'),
        )
        ids = await backend.tokenize([ChatTurn("user", "please call get_time")], True)
        sampling = SamplingOptions(
            max_tokens=200, tools=tools, tool_choice=ToolChoiceSpec(ToolChoiceMode.AUTO)
        )
        generation = await collect(backend, GenerationRequest("t1", tuple(ids), sampling))
        names = [part.name for delta in generation.deltas for part in delta.tool_calls if part.name]
        assert names == ["get_time"]
    finally:
        await backend.close()
