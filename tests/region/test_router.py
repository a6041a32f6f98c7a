"""KvAffinityRouter over four in-process simulator pods: precise affinity,
the hot-spot guard, round robin, least loaded, exclusion and the
approximate policy. Decisions are checked by pod and count, never by time."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Collection, Sequence

import pytest
import pytest_asyncio

from llmmesh.core.errors import Unavailable
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.region.placement.kv_events_feed import Backoff, KvEventFeeds
from llmmesh.region.placement.kv_index import InMemoryPrefixIndex, PrefixIndexError
from llmmesh.region.placement.router import KvAffinityRouter, RoutingDecision, RoutingPolicy, RoutingTuning
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.v1 import common_pb2, engine_service_pb2
from tests.region.support import BLOCK, Reply, chat, generate, pod_settings, sim
from tests.stack import wait_until

MODEL = "llmmesh-tiny"
SYSTEM = (
    "system:You are the support assistant of a fruit shop. Answer briefly, politely and only "
    "about fruit: apples, pears, plums, cherries and their seasons."
)
NO_GUARD = RoutingTuning(hotspot_queue_gap=10**6, hotspot_kv_usage=2.0)


@dataclasses.dataclass
class Region:
    """Four pods, the pool over them, and the index their feeds keep."""

    pods: list[EnginePod]
    pool: EnginePool
    index: InMemoryPrefixIndex
    feeds: KvEventFeeds
    tokenizer: TokenizerClient

    def router(self, policy: RoutingPolicy, tuning: RoutingTuning | None = None) -> KvAffinityRouter:
        return KvAffinityRouter(policy, self.pool, self.index, self.tokenizer, tuning)

    def handle(self, pod_id: str) -> EnginePodHandle:
        return next(p for p in self.pool.pods if p.pod_id == pod_id)

    async def synced(self) -> None:
        """Wait until the index holds every event each pod has published."""

        def done() -> bool:
            for pod in self.pods:
                subscriber = self.feeds.subscriber(pod.pod_id)
                cursor = subscriber.cursor if subscriber else None
                if cursor is None or cursor.last_sequence != sim(pod).kv_event_log.last_sequence:
                    return False
            return True

        await wait_until(done, 20, "index caught up with every pod")

    async def load(self, pod_id: str) -> engine_service_pb2.LoadReport:
        stub = self.handle(pod_id).stub
        response: engine_service_pb2.GetLoadResponse = await stub.GetLoad(engine_service_pb2.GetLoadRequest())
        return response.report


@pytest_asyncio.fixture
async def region() -> AsyncIterator[Region]:
    pods = list(await asyncio.gather(*(start_engine(pod_settings(pod_id=f"pod-{n}")) for n in range(4))))
    pool = EnginePool([pod.address for pod in pods])
    index = InMemoryPrefixIndex()
    feeds = KvEventFeeds(index, Backoff(initial_s=0.01, max_s=0.1))
    try:
        await pool.check()
        assert [p.pod_id for p in pool.healthy_pods] == ["pod-0", "pod-1", "pod-2", "pod-3"]
        feeds.follow(pool.healthy_pods)
        yield Region(pods, pool, index, feeds, TokenizerClient(pool))
    finally:
        await feeds.close()
        await pool.close()
        for pod in pods:
            await pod.stop(0.5)


async def run_turn(
    router: KvAffinityRouter, messages: Sequence[common_pb2.ChatMessage], exclude: Collection[str] = ()
) -> tuple[RoutingDecision, Reply]:
    """Place a turn and run it there, counting it in flight as the gateway does."""
    decision, _ = await router.choose_for_messages(MODEL, messages, exclude)
    decision.pod.in_flight += 1
    try:
        return decision, await generate(decision.pod.stub, messages)
    finally:
        decision.pod.in_flight -= 1


@pytest.mark.asyncio
async def test_precise_returns_a_conversation_to_the_pod_that_holds_it(region: Region) -> None:
    router = region.router(RoutingPolicy.PRECISE)
    history = [SYSTEM, "Which apples keep best over winter?"]
    first, reply = await run_turn(router, chat(*history), exclude={"pod-0", "pod-1", "pod-3"})
    assert (first.pod_id, reply.pod_id, first.resident_tokens) == ("pod-2", "pod-2", 0)
    hits_before = (await region.load("pod-2")).prefix_cache_hits
    for question in ["And which pears?", "And plums?", "Cherries, finally?"]:
        prompt_so_far = await region.tokenizer.tokenize(MODEL, chat(*history))
        history += [reply.text, question]
        await region.synced()
        decision, reply = await run_turn(router, chat(*history))
        assert decision.pod_id == "pod-2"
        assert decision.resident_tokens >= len(prompt_so_far) // BLOCK * BLOCK
        assert decision.score_parts["guard"] == 0.0
        assert reply.cached_prompt_tokens > 0
    assert (await region.load("pod-2")).prefix_cache_hits > hits_before
    for other in ["pod-0", "pod-1", "pod-3"]:
        assert (await region.load(other)).prefix_cache_queries == 0, f"{other} never got a turn"
    # Without affinity the same turn would have gone to the first idle pod.
    least, _ = await region.router(RoutingPolicy.LEAST_LOADED).choose_for_messages(MODEL, chat(*history))
    assert least.pod_id == "pod-0"


async def place(router: KvAffinityRouter, messages: Sequence[common_pb2.ChatMessage]) -> RoutingDecision:
    """Choose a pod and count the turn in flight there (not run yet)."""
    decision, _ = await router.choose_for_messages(MODEL, messages)
    decision.pod.in_flight += 1
    return decision


@pytest.mark.asyncio
async def test_hot_spot_guard_spreads_a_flood_of_one_system_prompt(region: Region) -> None:
    router = region.router(RoutingPolicy.PRECISE)
    warm, _ = await run_turn(router, chat(SYSTEM, "Warm-up question about apples?"))
    await region.synced()
    # Light load: every turn goes where the shared system prompt is cached.
    for n in range(3):
        decision, reply = await run_turn(router, chat(SYSTEM, f"Light question {n} about pears?"))
        assert decision.pod_id == warm.pod_id and decision.resident_tokens > 0
        assert reply.cached_prompt_tokens > 0
    # Without the guard a flood of the same prefix piles onto that one pod.
    pinned = [
        await place(region.router(RoutingPolicy.PRECISE, NO_GUARD), chat(SYSTEM, f"q{n}")) for n in range(12)
    ]
    assert Counter(d.pod_id for d in pinned) == {warm.pod_id: 12}
    for decision in pinned:
        decision.pod.in_flight -= 1
    # With it, the flood spreads once a turn waits behind the cache pod's
    # full batch: the guard sends one turn to a calm pod, whose copy of the
    # prefix (the router's own placement, until the pod's events confirm
    # it) then draws the next turns by score, until it runs hot in turn.
    flood = [await place(router, chat(SYSTEM, f"Flood question {n} about plums?")) for n in range(12)]
    counts = Counter(d.pod_id for d in flood)
    assert counts[warm.pod_id] == 5
    assert sorted(counts.values(), reverse=True) == [5, 4, 3]
    assert sum(1 for d in flood if d.score_parts["guard"]) == 2

    async def finish(decision: RoutingDecision, n: int) -> None:
        try:
            await generate(decision.pod.stub, chat(SYSTEM, f"Flood question {n} about plums?"))
        finally:
            decision.pod.in_flight -= 1

    await asyncio.gather(*(finish(d, n) for n, d in enumerate(flood)))
    for pod_id in counts:
        assert (await region.load(pod_id)).prefix_cache_queries > 0, f"{pod_id} ran its share"


@pytest.mark.asyncio
async def test_a_full_kv_cache_report_trips_the_guard(region: Region) -> None:
    router = region.router(RoutingPolicy.PRECISE)
    warm, _ = await run_turn(router, chat(SYSTEM, "Warm-up question about apples?"))
    await region.synced()
    prompt = await region.tokenizer.tokenize(MODEL, chat(SYSTEM, "Next question?"))
    router.loads.record(engine_service_pb2.LoadReport(pod_id=warm.pod_id, kv_cache_usage=0.95))
    busy = await router.choose(MODEL, prompt)
    assert busy.pod_id != warm.pod_id and busy.score_parts["guard"] == 1.0
    # That turn never ran: the router must not count on its prefix there.
    router.pending.forget_pod(busy.pod_id)
    router.loads.record(engine_service_pb2.LoadReport(pod_id=warm.pod_id, kv_cache_usage=0.2))
    calm = await router.choose(MODEL, prompt)
    assert calm.pod_id == warm.pod_id and calm.resident_tokens > 0


class BrokenIndex(InMemoryPrefixIndex):
    async def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        raise PrefixIndexError("the store is down")


@pytest.mark.asyncio
async def test_a_failing_index_falls_back_to_load(region: Region) -> None:
    router = KvAffinityRouter(RoutingPolicy.PRECISE, region.pool, BrokenIndex(), region.tokenizer)
    region.handle("pod-0").in_flight += 1
    try:
        decision = await router.choose(MODEL, [1, 2, 3, 4, 5])
    finally:
        region.handle("pod-0").in_flight -= 1
    assert (decision.pod_id, decision.score_parts["index_down"]) == ("pod-1", 1.0)


@pytest.mark.asyncio
async def test_round_robin_cycles(region: Region) -> None:
    router = region.router(RoutingPolicy.ROUND_ROBIN)
    chosen = [(await router.choose(MODEL, [1, 2, 3])).pod_id for _ in range(8)]
    assert chosen == ["pod-0", "pod-1", "pod-2", "pod-3"] * 2


@pytest.mark.asyncio
async def test_least_loaded_follows_the_load_reports(region: Region) -> None:
    router = region.router(RoutingPolicy.LEAST_LOADED)
    await router.loads.refresh()
    assert all(router.loads.report(f"pod-{n}") is not None for n in range(4))
    assert (await router.choose(MODEL, [1, 2, 3])).pod_id == "pod-0", "all idle: the first"
    for report in [
        engine_service_pb2.LoadReport(pod_id="pod-0", running=3),
        engine_service_pb2.LoadReport(pod_id="pod-1", running=4, waiting=2),
        engine_service_pb2.LoadReport(pod_id="pod-2", kv_cache_usage=0.5),
        engine_service_pb2.LoadReport(pod_id="pod-3", running=1),
    ]:
        router.loads.record(report)
    assert (await router.choose(MODEL, [1, 2, 3])).pod_id == "pod-3"
    # Turns this router has in flight count before the next report comes.
    region.handle("pod-3").in_flight += 2
    try:
        assert (await router.choose(MODEL, [1, 2, 3])).pod_id == "pod-2"
    finally:
        region.handle("pod-3").in_flight -= 2


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", list(RoutingPolicy))
async def test_exclude_is_honoured(region: Region, policy: RoutingPolicy) -> None:
    router = region.router(policy)
    excluded = {"pod-0", region.handle("pod-1").address}
    for _ in range(4):
        assert (await router.choose(MODEL, [1, 2, 3, 4, 5], excluded)).pod_id in {"pod-2", "pod-3"}
    with pytest.raises(Unavailable):
        await router.choose(MODEL, [1, 2, 3], {"pod-0", "pod-1", "pod-2", "pod-3"})
    with pytest.raises(Unavailable):
        await router.choose("another-model", [1, 2, 3])


@pytest.mark.asyncio
async def test_approximate_remembers_recent_prefixes(region: Region) -> None:
    now = [0.0]
    router = KvAffinityRouter(
        RoutingPolicy.APPROXIMATE,
        region.pool,
        None,
        region.tokenizer,
        RoutingTuning(approx_block_size=BLOCK, approx_ttl_s=60.0),
        clock=lambda: now[0],
    )
    shared = list(range(100, 140))
    first = await router.choose(MODEL, [*shared, 1, 2])
    assert (first.pod_id, first.resident_tokens) == ("pod-0", 0)
    region.handle("pod-0").in_flight += 1
    try:
        again = await router.choose(MODEL, [*shared, 3, 4, 5])
        assert (again.pod_id, again.resident_tokens) == ("pod-0", len(shared))
        other = await router.choose(MODEL, list(range(500, 540)))
        assert (other.pod_id, other.resident_tokens) == ("pod-1", 0)
        now[0] = 61.0
        expired = await router.choose(MODEL, [*shared, 6])
        assert expired.resident_tokens == 0 and expired.pod_id != "pod-0"
    finally:
        region.handle("pod-0").in_flight -= 1


@pytest.mark.asyncio
async def test_the_tokenizer_matches_the_pod_and_caches(region: Region) -> None:
    messages = chat(SYSTEM, "How sweet are cherries?")
    first = await region.tokenizer.tokenize(MODEL, messages)
    second = await region.tokenizer.tokenize(MODEL, messages)
    response = await region.handle("pod-3").stub.Tokenize(
        engine_service_pb2.TokenizeRequest(messages=messages, add_generation_prompt=True)
    )
    assert first == second == tuple(response.token_ids)
    assert (region.tokenizer.misses, region.tokenizer.hits) == (1, 1)
    assert await region.tokenizer.tokenize(MODEL, chat(SYSTEM, "How sour are cherries?")) != first


@pytest.mark.asyncio
async def test_the_guard_leaves_a_busy_pod_alone_while_it_can_still_start_the_turn(region: Region) -> None:
    router = region.router(RoutingPolicy.PRECISE)
    warm, _ = await run_turn(router, chat(SYSTEM, "Warm-up question about apples?"))
    await region.synced()
    prompt = await region.tokenizer.tokenize(MODEL, chat(SYSTEM, "Next question?"))
    warm.pod.info.max_num_seqs = 8
    # Five turns deeper than the others, but three batch slots free: a cache
    # hit there starts at once, a miss elsewhere would prefill the prompt.
    router.loads.record(engine_service_pb2.LoadReport(pod_id=warm.pod_id, running=5))
    stays = await router.choose(MODEL, prompt)
    assert stays.pod_id == warm.pod_id and stays.score_parts["guard"] == 0.0
    # A full batch and a queue: the turn would wait, so it goes elsewhere.
    router.loads.record(engine_service_pb2.LoadReport(pod_id=warm.pod_id, running=8, waiting=2))
    moves = await router.choose(MODEL, prompt)
    assert moves.pod_id != warm.pod_id and moves.score_parts["guard"] == 1.0
