"""The context builder with a counter that mimics a chat template, and with a
real simulator pod's Tokenize behind the region's TokenizerClient."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.server import start_engine
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.region.turn.context_builder import MIN_OUTPUT_TOKENS, FittedContext, fit_context, split_turns
from llmmesh.v1 import common_pb2
from tests.region.support import chat, pod_settings

SYSTEM = common_pb2.CHAT_ROLE_SYSTEM
USER = common_pb2.CHAT_ROLE_USER
ASSISTANT = common_pb2.CHAT_ROLE_ASSISTANT
TOOL = common_pb2.CHAT_ROLE_TOOL

# The fake template: a prompt frame, and a role header per message.
FRAME = 3
PER_MESSAGE = 4


def msg(role: common_pb2.ChatRole.ValueType, content: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=content)


class TemplateCounter:
    """Counts like a chat template (a frame, a header per message, a token
    per word) and remembers how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    @staticmethod
    def tokens(messages: Sequence[common_pb2.ChatMessage]) -> int:
        return FRAME + sum(PER_MESSAGE + len(m.content.split()) for m in messages)

    async def __call__(self, messages: Sequence[common_pb2.ChatMessage]) -> int:
        self.calls += 1
        return self.tokens(messages)


def conversation(turns: int, words: int = 5) -> list[common_pb2.ChatMessage]:
    """``turns`` question-and-answer pairs, each message ``words`` words long."""
    history: list[common_pb2.ChatMessage] = []
    for n in range(turns):
        history.append(msg(USER, " ".join([f"q{n}"] * words)))
        history.append(msg(ASSISTANT, " ".join([f"a{n}"] * words)))
    return history


SYSTEM_PROMPT = [msg(SYSTEM, "You answer briefly.")]
NEW = [msg(USER, "And what about pears?")]


async def fit(
    history: Sequence[common_pb2.ChatMessage],
    window: int,
    reserve: int = 1,
    counter: TemplateCounter | None = None,
    system: Sequence[common_pb2.ChatMessage] = SYSTEM_PROMPT,
) -> FittedContext:
    return await fit_context(
        system,
        history,
        NEW,
        window_tokens=window,
        reserve_output_tokens=reserve,
        count_tokens=counter or TemplateCounter(),
    )


@pytest.mark.asyncio
async def test_everything_fits_in_one_count() -> None:
    history = conversation(4)
    counter = TemplateCounter()
    fitted = await fit(history, window=1000, reserve=100, counter=counter)
    assert fitted.messages == (*SYSTEM_PROMPT, *history, *NEW)
    assert fitted.prompt_tokens == TemplateCounter.tokens(fitted.messages)
    assert fitted.dropped_messages == 0
    assert counter.calls == 1


@pytest.mark.asyncio
async def test_oldest_turns_go_first_and_the_system_prompt_stays() -> None:
    history = conversation(6)
    last_two = history[-4:]
    needed = TemplateCounter.tokens([*SYSTEM_PROMPT, *last_two, *NEW])
    fitted = await fit(history, window=needed + 10, reserve=10)
    assert fitted.messages == (*SYSTEM_PROMPT, *last_two, *NEW)
    assert fitted.dropped_messages == 8
    assert fitted.prompt_tokens == needed
    # One token less and the second-newest turn has to go too.
    tighter = await fit(history, window=needed + 9, reserve=10)
    assert tighter.messages == (*SYSTEM_PROMPT, *history[-2:], *NEW)
    assert tighter.dropped_messages == 10


@pytest.mark.asyncio
async def test_turns_are_dropped_whole() -> None:
    # The first turn has a tool call and two replies; it goes as one piece.
    history = [
        msg(USER, "look it up"),
        msg(ASSISTANT, "calling the tool"),
        msg(TOOL, "forty two"),
        msg(ASSISTANT, "it is forty two"),
        *conversation(2),
    ]
    everything = TemplateCounter.tokens([*SYSTEM_PROMPT, *history, *NEW])
    fitted = await fit(history, window=everything, reserve=1)
    assert fitted.dropped_messages == 4
    assert fitted.messages[1].role == USER
    assert fitted.messages == (*SYSTEM_PROMPT, *history[4:], *NEW)


@pytest.mark.asyncio
async def test_a_leading_reply_without_its_question_is_dropped_first() -> None:
    history = [msg(ASSISTANT, "an orphaned reply"), *conversation(2)]
    everything = TemplateCounter.tokens([*SYSTEM_PROMPT, *history, *NEW])
    whole = await fit(history, window=everything + 1)
    assert whole.dropped_messages == 0
    fitted = await fit(history, window=everything)
    assert fitted.dropped_messages == 1
    assert fitted.messages[1].role == USER


@pytest.mark.asyncio
async def test_long_histories_cost_logarithmically_many_counts() -> None:
    history = conversation(1000)
    counter = TemplateCounter()
    needed = TemplateCounter.tokens([*SYSTEM_PROMPT, *history[-20:], *NEW])
    fitted = await fit(history, window=needed + 1, counter=counter)
    assert fitted.dropped_messages == len(history) - 20
    assert counter.calls <= 2 + math.ceil(math.log2(1000))


@pytest.mark.asyncio
async def test_a_prompt_that_cannot_fit_is_too_long() -> None:
    floor = TemplateCounter.tokens([*SYSTEM_PROMPT, *NEW])
    with pytest.raises(InvalidArgument) as info:
        await fit(conversation(3), window=floor + 50, reserve=51)
    error = info.value
    assert error.reason == Reason.PROMPT_TOO_LONG
    assert error.metadata == {"param": "messages"}
    assert str(floor) in error.message and "51" in error.message and str(floor + 50) in error.message
    # Without any history the check is the same.
    with pytest.raises(InvalidArgument):
        await fit([], window=floor, reserve=1)


@pytest.mark.asyncio
async def test_at_least_one_output_token_is_reserved() -> None:
    floor = TemplateCounter.tokens([*SYSTEM_PROMPT, *NEW])
    with pytest.raises(InvalidArgument):
        await fit([], window=floor, reserve=0)
    fitted = await fit([], window=floor + MIN_OUTPUT_TOKENS, reserve=0)
    assert fitted.prompt_tokens == floor


@pytest.mark.asyncio
async def test_several_system_messages_are_all_kept() -> None:
    system = [msg(SYSTEM, "Be brief."), msg(common_pb2.CHAT_ROLE_DEVELOPER, "Use metric units.")]
    history = conversation(3)
    needed = TemplateCounter.tokens([*system, *history[-2:], *NEW])
    fitted = await fit(history, window=needed + 1, system=system)
    assert fitted.messages == (*system, *history[-2:], *NEW)


def test_split_turns_separates_the_system_prompt_and_groups_turns() -> None:
    messages = [
        msg(SYSTEM, "s"),
        msg(common_pb2.CHAT_ROLE_DEVELOPER, "d"),
        msg(ASSISTANT, "orphan"),
        msg(USER, "u1"),
        msg(ASSISTANT, "a1"),
        msg(TOOL, "t1"),
        msg(USER, "u2"),
        msg(SYSTEM, "mid-conversation note"),
        msg(USER, "u3"),
    ]
    system, turns = split_turns(messages)
    assert [m.content for m in system] == ["s", "d"]
    assert [[m.content for m in turn] for turn in turns] == [
        ["orphan"],
        ["u1", "a1", "t1"],
        ["u2", "mid-conversation note"],
        ["u3"],
    ]
    assert split_turns([]) == ((), [])


# A history: turns of a user message and 0 to 2 replies, maybe after an orphaned reply.
turn_shapes = st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(0, 12), max_size=2)), max_size=12)


@given(
    orphan=st.booleans(),
    shapes=turn_shapes,
    window=st.integers(1, 250),
    reserve=st.integers(0, 40),
)
def test_the_result_is_the_longest_whole_turn_suffix_that_fits(
    orphan: bool, shapes: list[tuple[int, list[int]]], window: int, reserve: int
) -> None:
    history: list[common_pb2.ChatMessage] = [msg(ASSISTANT, "w " * 3)] if orphan else []
    for question, replies in shapes:
        history.append(msg(USER, "w " * question))
        history.extend(msg(ASSISTANT, "w " * words) for words in replies)
    boundaries = [0] if orphan or not history else []
    boundaries += [i for i, m in enumerate(history) if m.role == USER] + [len(history)]
    budget = window - max(reserve, 1)

    def tokens(start: int) -> int:
        return TemplateCounter.tokens([*SYSTEM_PROMPT, *history[start:], *NEW])

    fitting = [start for start in boundaries if tokens(start) <= budget]
    if not fitting:
        with pytest.raises(InvalidArgument) as info:
            asyncio.run(fit(history, window=window, reserve=reserve))
        assert info.value.reason == Reason.PROMPT_TOO_LONG
        return
    fitted = asyncio.run(fit(history, window=window, reserve=reserve))
    start = fitted.dropped_messages
    assert start == min(fitting)
    assert fitted.messages == (*SYSTEM_PROMPT, *history[start:], *NEW)
    assert fitted.prompt_tokens == tokens(start)
    assert fitted.prompt_tokens + max(reserve, 1) <= window


@pytest_asyncio.fixture
async def tokenizer() -> AsyncIterator[TokenizerClient]:
    pod = await start_engine(pod_settings())
    pool = EnginePool([pod.address])
    try:
        # A loaded machine may time the first health checks out: wait (bounded) for the pod.
        async with asyncio.timeout(20):
            await pool.check()
            while not pool.healthy_pods:
                await asyncio.sleep(0.2)
                await pool.check()
        yield TokenizerClient(pool)
    finally:
        await pool.close()
        await pod.stop(0)


@pytest.mark.asyncio
async def test_a_real_pod_tokenizer_decides_what_fits(tokenizer: TokenizerClient) -> None:
    """The counts are the pod's own: the template's per-message tokens
    included, which a sum of per-message counts would miss."""
    texts = [f"question {n} is about fruit number {n}" if n % 2 == 0 else f"answer {n}" for n in range(40)]
    messages = chat("system:You answer questions about fruit.", *texts, "Which fruit is best?")
    system, history, new = messages[:1], messages[1:-1], messages[-1:]
    calls = 0

    async def count(candidate: Sequence[common_pb2.ChatMessage]) -> int:
        nonlocal calls
        calls += 1
        return len(await tokenizer.tokenize("", candidate))

    everything = await count(messages)
    calls = 0
    window, reserve = everything // 2, 16
    fitted = await fit_context(
        system, history, new, window_tokens=window, reserve_output_tokens=reserve, count_tokens=count
    )
    assert 0 < fitted.dropped_messages < len(history)
    assert fitted.dropped_messages % 2 == 0
    kept = history[fitted.dropped_messages :]
    assert fitted.messages == (*system, *kept, *new)
    assert fitted.prompt_tokens == len(await tokenizer.tokenize("", fitted.messages))
    assert fitted.prompt_tokens + reserve <= window
    one_more_turn = [*system, *history[fitted.dropped_messages - 2 :], *new]
    assert len(await tokenizer.tokenize("", one_more_turn)) + reserve > window
    assert calls <= 2 + math.ceil(math.log2(len(history) // 2))
