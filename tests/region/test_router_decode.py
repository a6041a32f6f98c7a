"""Placing a disaggregated turn's decode phase: under ``precise`` on the
decode pod that already holds the prompt's blocks (it pulls fewer, and a
tenant's turns share their prefix there), under the other policies and with
the prefix index down on the least-loaded decode pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio

from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.placement.kv_events_feed import Backoff, KvEventFeeds
from llmmesh.region.placement.kv_index import InMemoryPrefixIndex, PrefixIndexError
from llmmesh.region.placement.router import KvAffinityRouter, RoutingPolicy
from llmmesh.region.tokenizer_client import TokenizerClient
from tests.region.support import chat, expected_resident, generate, pod_settings, tokenize

MODEL = "llmmesh-tiny"
MESSAGES = chat("system:You answer questions about orchards and their fruit, briefly.", "Which pears?")
ROLES = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}


class BrokenIndex(InMemoryPrefixIndex):
    async def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        raise PrefixIndexError("the index is down")


@pytest_asyncio.fixture
async def pods() -> AsyncIterator[dict[str, EnginePod]]:
    started = await asyncio.gather(
        *(start_engine(pod_settings(pod_id=pod_id, pod_role=role)) for pod_id, role in ROLES.items())
    )
    yield {pod.pod_id: pod for pod in started}
    for pod in started:
        await pod.stop(0.5)


@pytest.mark.asyncio
async def test_the_decode_phase_goes_where_the_prompt_is_resident(pods: dict[str, EnginePod]) -> None:
    pool = EnginePool([pod.address for pod in pods.values()])
    index = InMemoryPrefixIndex()
    feeds = KvEventFeeds(index, Backoff(initial_s=0.01, max_s=0.1))
    try:
        await pool.check()
        feeds.follow(pool.healthy_pods)
        decode_1 = next(pod for pod in pool.pods if pod.pod_id == "decode-1")
        # decode-1 served this prompt before, so its blocks are resident there.
        await generate(decode_1.stub, MESSAGES)
        token_ids = await tokenize(decode_1.stub, MESSAGES)
        resident = expected_resident(pods["decode-1"], token_ids)
        assert resident > 0

        async def indexed() -> bool:
            return (await index.match(token_ids)).get("decode-1", 0) == resident

        for _ in range(200):
            if await indexed():
                break
            await asyncio.sleep(0.02)
        assert await indexed()
        tokenizer = TokenizerClient(pool)
        precise = KvAffinityRouter(RoutingPolicy.PRECISE, pool, index, tokenizer)
        decision, _ = await precise.choose_for_messages(MODEL, MESSAGES)
        assert (decision.prefill_pod_id, decision.pod_id) == ("prefill-0", "decode-1")
        # Placed on load alone, the idle decode-0 comes first.
        for policy, router_index in (
            (RoutingPolicy.LEAST_LOADED, index),
            (RoutingPolicy.PRECISE, BrokenIndex()),
        ):
            router = KvAffinityRouter(policy, pool, router_index, tokenizer)
            decision, _ = await router.choose_for_messages(MODEL, MESSAGES)
            assert decision.pod_id == "decode-0", policy
    finally:
        await feeds.close()
        await pool.close()
