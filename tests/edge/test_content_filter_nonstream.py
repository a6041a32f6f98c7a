"""A whole (not streamed) chat completion that the output filter stopped
names the categories that stopped it, as the streamed finish chunk does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmmesh.edge.chunks import blocked_categories, completion_object
from llmmesh.edge.reply_parts import ReplyCollector
from llmmesh.v1 import chat_service_pb2, common_pb2
from tests.stack import DEV_KEY, running_stack

AUTH = {"authorization": f"Bearer {DEV_KEY}"}
PROMPT = [{"role": "user", "content": "Tell me about resumable streams."}]


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": PROMPT, "seed": 3, **extra}


async def _complete(overrides: dict[str, object] | None = None) -> dict[str, Any]:
    """One whole completion from a fresh mesh whose region has ``overrides``."""
    async with running_stack(with_edge=True, region_overrides=overrides) as stack:
        assert stack.edge is not None
        async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
            resp = await client.post("/v1/chat/completions", json=_body(), headers=AUTH)
    assert resp.status_code == 200, resp.text
    completion: dict[str, Any] = resp.json()
    return completion


@pytest.mark.asyncio
async def test_a_blocked_completion_names_its_categories() -> None:
    unfiltered = await _complete()
    choice = unfiltered["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert "content_filter_results" not in choice
    reply = choice["message"]["content"]
    words = [w for w in reply.split() if w.isalpha() and len(w) > 3]
    assert len(words) > 4, reply
    denied = words[len(words) // 2]

    blocked = (await _complete({"safety_deny_terms": f"violence={denied}"}))["choices"][0]
    assert blocked["finish_reason"] == "content_filter"
    assert blocked["content_filter_results"] == {"violence": {"filtered": True}}
    kept = blocked["message"]["content"]
    assert denied not in kept.split() and reply.startswith(kept)


def _verdict(*, blocked: bool, categories: list[str]) -> chat_service_pb2.SafetyVerdict:
    return chat_service_pb2.SafetyVerdict(
        stage=chat_service_pb2.SAFETY_STAGE_OUTPUT, flagged=True, categories=categories, blocked=blocked
    )


def test_only_a_blocking_verdict_names_categories() -> None:
    assert blocked_categories(None) == []
    assert blocked_categories(_verdict(blocked=False, categories=["pii"])) == []
    assert blocked_categories(_verdict(blocked=True, categories=["violence", "hate"])) == [
        "violence",
        "hate",
    ]


def test_the_completion_object_carries_the_categories_on_its_choice() -> None:
    usage = common_pb2.TokenUsage(input_tokens=3, output_tokens=2)
    reply = ReplyCollector(text=["Hi"])
    args = ("chatcmpl-1", 1, "m", reply, common_pb2.FINISH_REASON_CONTENT_FILTER, usage)
    choice = completion_object(*args, ["violence", "hate"])["choices"]
    assert isinstance(choice, list)
    assert choice[0]["finish_reason"] == "content_filter"
    assert choice[0]["content_filter_results"] == {"violence": {"filtered": True}, "hate": {"filtered": True}}
    plain = completion_object(*args)["choices"]
    assert isinstance(plain, list) and "content_filter_results" not in plain[0]
