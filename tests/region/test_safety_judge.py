"""LlmJudgeBackend: strict parsing, prompting, failing closed."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.region.safety import (
    ALL_CATEGORIES,
    DEFAULT_POLICY,
    CompleteFn,
    InputFilter,
    JudgeAnswerError,
    LlmJudgeBackend,
    StreamingOutputFilter,
    parse_judgement,
)

Turns = list[tuple[str, str]]


class ScriptedModel:
    """Answers every call with ``answer`` and remembers what it was asked."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls: list[tuple[Turns, int]] = []

    async def __call__(self, turns: Turns, max_tokens: int) -> str:
        self.calls.append((turns, max_tokens))
        return self.answer


async def hanging_model(turns: Turns, max_tokens: int) -> str:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def failing_model(turns: Turns, max_tokens: int) -> str:
    raise ConnectionError("engine pod gone")


@pytest.mark.parametrize(
    ("answer", "categories"),
    [
        ("SAFE", ()),
        ("  SAFE\n", ()),
        ("UNSAFE: violence", ("violence",)),
        ("UNSAFE:violence,hate/threatening", ("violence", "hate/threatening")),
        ("UNSAFE: pii , prompt_injection, pii", ("pii", "prompt_injection")),
    ],
)
def test_parse_accepts_the_two_forms(answer: str, categories: tuple[str, ...]) -> None:
    assert parse_judgement(answer) == categories


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "safe",
        "SAFE.",
        "The text is SAFE",
        "UNSAFE",
        "UNSAFE:",
        "UNSAFE: ",
        "UNSAFE: violence,",
        "UNSAFE: Violence",
        "UNSAFE: weapons",
        "UNSAFE: violence\nSAFE",
        "SAFE\nUNSAFE: violence",
        "I cannot help with that.",
    ],
)
def test_parse_rejects_everything_else(answer: str) -> None:
    with pytest.raises(JudgeAnswerError):
        parse_judgement(answer)


@given(st.text(max_size=40))
def test_parse_never_returns_unknown_categories(answer: str) -> None:
    try:
        categories = parse_judgement(answer)
    except JudgeAnswerError:
        return
    assert set(categories) <= set(ALL_CATEGORIES)


def test_default_policy_names_every_category_and_the_format() -> None:
    for name in ALL_CATEGORIES:
        assert f"- {name}\n" in DEFAULT_POLICY + "\n"
    assert "UNSAFE: <category>, <category>" in DEFAULT_POLICY


@pytest.mark.asyncio
async def test_judge_asks_with_the_policy_and_fences_the_text() -> None:
    model = ScriptedModel("UNSAFE: violence")
    judge = LlmJudgeBackend(model, "POLICY", max_tokens=16)
    verdict = await judge.check("some reply", kind="output")
    assert verdict.flagged
    assert verdict.categories == ("violence",)
    assert verdict.backend == "judge"
    ((turns, max_tokens),) = model.calls
    assert max_tokens == 16
    assert turns[0] == ("system", "POLICY")
    role, content = turns[1]
    assert role == "user"
    assert "assistant output" in content
    fence = content.splitlines()[1]
    assert content.endswith(f"{fence}\nsome reply\n{fence}")


@pytest.mark.asyncio
async def test_safe_answer_passes() -> None:
    verdict = await LlmJudgeBackend(ScriptedModel("SAFE")).check("hello", kind="input")
    assert not verdict.flagged
    assert verdict.categories == ()


@pytest.mark.asyncio
async def test_prompt_injection_is_ignored_on_output_and_report_only_respected() -> None:
    judge = LlmJudgeBackend(ScriptedModel("UNSAFE: prompt_injection, pii"), report_only=["pii"])
    on_output = await judge.check("text", kind="output")
    assert not on_output.flagged
    assert on_output.reported == ("pii",)
    on_input = await judge.check("text", kind="input")
    assert on_input.categories == ("prompt_injection",)


@pytest.mark.asyncio
async def test_long_text_is_judged_in_overlapping_chunks() -> None:
    model = ScriptedModel("SAFE")
    judge = LlmJudgeBackend(model, max_chars=100, overlap_chars=20)
    text = "".join(chr(ord("a") + i % 26) for i in range(250))
    await judge.check(text, kind="input")
    judged = [turns[1][1].splitlines()[2] for turns, _ in model.calls]
    assert judged == [text[0:100], text[80:180], text[160:260]]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("model", "timeout_s"),
    [
        (ScriptedModel("I think this is fine"), 5.0),
        (ScriptedModel("UNSAFE: made-up"), 5.0),
        (failing_model, 5.0),
        (hanging_model, 0.01),
    ],
)
async def test_judge_failures_fail_closed(model: CompleteFn, timeout_s: float) -> None:
    judge = LlmJudgeBackend(model)
    with pytest.raises(Unavailable) as on_input:
        await InputFilter([judge], timeout_s=timeout_s).check([("user", "hello")])
    assert on_input.value.reason == Reason.SAFETY_UNAVAILABLE
    assert on_input.value.retry_after_s is not None
    output = StreamingOutputFilter([judge], timeout_s=timeout_s)
    await output.feed("hello")
    with pytest.raises(Unavailable) as on_output:
        await output.finish()
    assert on_output.value.reason == Reason.SAFETY_UNAVAILABLE


def test_judge_rejects_bad_chunking() -> None:
    with pytest.raises(ValueError, match="overlap"):
        LlmJudgeBackend(ScriptedModel("SAFE"), max_chars=10, overlap_chars=10)
