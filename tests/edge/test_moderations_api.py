"""``POST /v1/moderations`` with the official ``openai`` SDK against the
in-process stack: OpenAI's categories and scores from the region's safety
backends, text parts, and 400/404s naming the param."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.types import ModerationTextInputParam

from llmmesh.region.safety import OPENAI_CATEGORIES
from tests.edge.sdk import async_client
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One mesh for the module's tests: none leaves anything another reads."""
    return shared_stack


async def test_the_sdk_gets_openai_categories_and_scores(stack: Stack) -> None:
    async with async_client(stack) as client:
        result = await client.moderations.create(
            input=["Have a nice day.", "Tell me how to build a pipe bomb."]
        )
    assert result.model == "llmmesh-moderation" and result.id.startswith("modr-")
    clean, flagged = result.results
    assert not clean.flagged
    assert set(clean.category_scores.model_dump(by_alias=True)) == set(OPENAI_CATEGORIES)
    assert flagged.flagged and flagged.categories.illicit_violent
    assert flagged.category_scores.illicit_violent == 1.0
    assert flagged.category_scores.harassment == 0.0
    assert flagged.category_applied_input_types.illicit_violent == ["text"]


async def test_a_single_string_and_text_parts_are_served(stack: Stack) -> None:
    async with async_client(stack) as client:
        single = await client.moderations.create(input="I want to kill myself", model="llmmesh-moderation")
        text_part: ModerationTextInputParam = {"type": "text", "text": "I want to kill myself"}
        parts = await client.moderations.create(input=[text_part], model="llmmesh-moderation")
    assert single.results[0].categories.self_harm_intent
    assert parts.results[0].model_dump() == single.results[0].model_dump()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": 5}, 400, "input"),
        ({"input": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}, 400, "input"),
        ({"input": [{"type": "text", "text": 3}]}, 400, "input"),
        ({"input": "x", "model": 7}, 400, "model"),
        ({"input": "x", "model": "omni-moderation-2024-09-26"}, 404, "model"),
        ({"input": "x", "threshold": 0.5}, 400, "threshold"),
    ],
)
async def test_bad_bodies_name_the_param(stack: Stack, body: dict[str, Any], status: int, param: str) -> None:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        resp = await http.post("/v1/moderations", json=body, headers={"authorization": f"Bearer {DEV_KEY}"})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"] == param


async def test_moderation_needs_a_key(stack: Stack) -> None:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        resp = await http.post("/v1/moderations", json={"input": "x"})
    assert resp.status_code == 401


@pytest.mark.parametrize(
    "alias", ["omni-moderation-latest", "text-moderation-latest", "text-moderation-stable"]
)
async def test_openai_s_latest_aliases_are_answered_by_the_region_s_backends(
    stack: Stack, alias: str
) -> None:
    async with async_client(stack) as client:
        answer = await client.moderations.create(model=alias, input="I want to kill myself")
    assert answer.model == "llmmesh-moderation"  # who answered, by its own name
    assert answer.results[0].flagged
