"""Facts learned by a model (``memory_extractor=model``) through HTTP over an
in-process mesh on the simulator. The simulator's facts are its modelled
text, not understanding, so these tests check the pipeline: after a turn
the region asks the zone's smallest chat model, guided to the facts' JSON
schema, at the priority behind every tenant's turn; what it answers is
validated, kept, and recalled into the user's next turn; nothing is asked
for a tenant whose policy keeps memory off; and the call is billed to the
tenant as background work, a line of its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llmmesh.region.admission.fair_queue import UNKNOWN_TIER_PRIORITY
from llmmesh.region.engine_complete import Completion, engine_generator
from llmmesh.region.knowledge.memory import rules_extractor
from llmmesh.region.knowledge.memory_model import FACTS_SCHEMA, fact_extractor, parse_facts
from llmmesh.region.lifecycle import housekeeping_model as housekeeping
from llmmesh.region.settings import RegionSettings
from llmmesh.v1 import common_pb2
from tests.edge.test_memories_api import auth, facts, tenant_key, turn
from tests.stack import DEV_KEY, Stack, running_stack

SAYS = "Hello! My name is Greta Holm and I live in Bremen."


def test_a_reply_is_kept_only_as_a_list_of_facts() -> None:
    assert parse_facts('{"facts": [" The user  lives in Bremen. ", "", "The user lives in Bremen."]}') == [
        "The user lives in Bremen."
    ]
    assert parse_facts('{"facts": ["' + "x" * 301 + '"]}') == []
    for bad in ("not json", '["a"]', '{"facts": "a"}', '{"facts": [1]}'):
        with pytest.raises(ValueError, match=r"reply|fact"):
            parse_facts(bad)


def test_an_unknown_extractor_is_refused_by_its_setting() -> None:
    model = housekeeping.HousekeepingModel(None, None, tuple)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_extractor"):
        fact_extractor(RegionSettings(memory_extractor="magic"), model)
    assert fact_extractor(RegionSettings(), model) is rules_extractor


@pytest_asyncio.fixture
async def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every housekeeping call the region makes, with what its pod answered."""
    made: list[dict[str, Any]] = []

    def recording(pool: Any, model: str, **options: Any) -> Any:
        ask = engine_generator(pool, model, **options)

        async def complete(turns: list[tuple[str, str]], max_tokens: int) -> Completion:
            done = await ask(turns, max_tokens)
            made.append({"model": model, "reply": done.text, "done": done, **options})
            return done

        return complete

    monkeypatch.setattr(housekeeping, "engine_generator", recording)
    return made


@pytest_asyncio.fixture
async def stack(calls: list[dict[str, Any]]) -> AsyncIterator[Stack]:
    overrides = {"memory_extractor": "model", "summaries_enabled": False}
    async with running_stack(with_edge=True, region_overrides=overrides) as running:
        yield running


@pytest_asyncio.fixture
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    assert stack.edge is not None
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
        yield client


@pytest.mark.asyncio
async def test_the_model_is_asked_for_guided_facts_which_are_kept_and_recalled(
    stack: Stack, http: httpx.AsyncClient, calls: list[dict[str, Any]]
) -> None:
    memory = stack.region.gateway.memory
    assert memory is not None
    await turn(http, DEV_KEY, "u-off", SAYS)
    await memory.drain()
    assert calls == [] and await facts(http, DEV_KEY, "u-off") == []

    key = await tenant_key(stack, "remembers-by-model", memory=True)
    prompts = [await turn(http, key, "greta", SAYS)]
    await memory.drain()
    assert len(calls) == 1
    call = calls[0]
    assert call["priority"] == UNKNOWN_TIER_PRIORITY
    guided = call["response_format"]
    assert guided.type == common_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
    assert json.loads(guided.schema_json) == FACTS_SCHEMA
    # Whatever the simulator wrote is the schema's JSON, and is what was kept.
    expected = parse_facts(call["reply"])
    kept = await facts(http, key, "greta")
    assert sorted(str(f["content"]) for f in kept) == sorted(expected)
    assert expected  # the simulator's modelled facts for this prompt
    question = "Where do I live?"
    prompts += [await turn(http, key, "greta", question), await turn(http, key, "someone", question)]
    assert prompts[1] > prompts[2] + 3
    # The model's calls are billed to the tenant as background work: its three turns, and a memory line.
    await memory.drain()
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10)
    usage = await http.get("/v1/usage", headers=auth(key))
    assert usage.status_code == 200, usage.text
    assert len(calls) == 3
    extracted = sum(call["done"].input_tokens for call in calls)
    body = usage.json()
    assert body["input_tokens"] == sum(prompts) + extracted
    assert body["requests"] == 3
    lines = {line["purpose"]: line for line in body["lines"]}
    assert lines["memory"]["input_tokens"] == extracted and lines["memory"]["requests"] == 0
    assert lines["turn"]["input_tokens"] == sum(prompts)
