"""Request hedging on real simulator pods (gRPC, in process): a turn whose
pod is slow to its first token starts on a second pod after the deadline;
the first token wins, the slow pod's generation is aborted, and only the
winner's events (so only its usage) reach the gateway. Turns of a tier
above the hedging priority never hedge."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.region.engine_pool import EnginePool, PodView
from llmmesh.region.metrics import REGISTRY
from llmmesh.region.placement.hedging import HedgingPolicy
from llmmesh.region.placement.router import KvAffinityRouter, RoutingPolicy
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from tests.stack import DEV_KEY, MeshBuilder, region_settings, wait_until

pytestmark = pytest.mark.asyncio

POD = {"insecure": True, "context_window": 512, "sim_inter_token_s": 0.001, "sim_prefill_overhead_s": 0.0001}
PROMPT = list(range(300, 380))  # 80 tokens


@dataclass
class Pods:
    slow: EnginePod
    fast: EnginePod
    pool: EnginePool
    router: KvAffinityRouter


@pytest_asyncio.fixture
async def pods() -> AsyncIterator[Pods]:
    # 80 prompt tokens at 50 ms each: four seconds to the slow pod's first token.
    slow = await start_engine(EngineSettings(pod_id="slow", sim_prefill_per_token_s=0.05, **POD))  # type: ignore[arg-type]
    fast = await start_engine(EngineSettings(pod_id="fast", sim_prefill_per_token_s=0.00001, **POD))  # type: ignore[arg-type]
    pool = EnginePool([slow.address, fast.address])
    await pool.check()
    await wait_until(lambda: len(pool.healthy_pods) == 2, what="pods up")
    hedging = HedgingPolicy(after_s=0.2, max_priority=0)
    router = KvAffinityRouter(RoutingPolicy.ROUND_ROBIN, pool, None, TokenizerClient(pool), hedging=hedging)
    try:
        yield Pods(slow, fast, pool, router)
    finally:
        await pool.close()
        for pod in (slow, fast):
            await pod.stop(0.5)


def sim(pod: EnginePod) -> SimBackend:
    assert isinstance(pod.backend, SimBackend)
    return pod.backend


def hedge_counts() -> tuple[float, ...]:
    """Hedges started, won by the backup pod, and losers aborted so far."""
    names = ("hedges_started", "hedges_won", "hedge_losers_aborted")
    return tuple(REGISTRY.get_sample_value(f"llmmesh_region_{name}_total") or 0.0 for name in names)


async def run(pods: Pods, request_id: str, priority: int) -> list[pb.GenerationEvent]:
    decision = await pods.router.choose("", PROMPT)
    assert isinstance(decision.pod, PodView) and decision.pod_id == "slow"
    start = pb.GenerateStart(
        request_id=request_id,
        prompt_token_ids=PROMPT,
        sampling=common_pb2.SamplingParams(max_tokens=8, seed=1),
        priority=priority,
    )
    generation = await decision.pod.session.start(request_id, pb.GenerateSessionRequest(start=start))
    try:
        return [event async for event in generation]
    finally:
        generation.abandon("done")


async def test_a_premium_turn_slow_to_its_first_token_is_won_by_the_second_pod(pods: Pods) -> None:
    before = hedge_counts()
    events = await run(pods, "hedge-1", priority=0)
    assert hedge_counts() == tuple(count + 1 for count in before)
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds.count("started") == 1 and kinds[-1] == "finished"
    started = next(event.started for event in events if event.HasField("started"))
    assert started.pod_id == "fast"
    # Only the winner's usage: its prompt once, its eight tokens.
    assert events[-1].finished.usage.input_tokens == len(PROMPT)
    assert events[-1].finished.usage.output_tokens == 8
    assert sum(len(event.delta.token_ids) for event in events if event.HasField("delta")) == 8
    # The loser was aborted: nothing runs or waits on the slow pod.
    await wait_until(lambda: sim(pods.slow).load().running + sim(pods.slow).load().waiting == 0, what="abort")
    assert all(pod.in_flight == 0 for pod in pods.pool.pods)


async def test_a_turn_above_the_hedging_priority_waits_for_its_pod(pods: Pods) -> None:
    before = hedge_counts()
    events = await run(pods, "no-hedge", priority=2)
    assert hedge_counts() == before
    started = next(event.started for event in events if event.HasField("started"))
    assert started.pod_id == "slow"
    assert events[-1].finished.usage.output_tokens == 8
    assert sim(pods.fast).pool.query_tokens == 0


async def test_a_negative_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        HedgingPolicy(after_s=-1.0)


async def test_a_region_hedges_an_enterprise_turn_and_bills_the_winner_once() -> None:
    async with MeshBuilder() as build:
        glob = await build.global_plane(dev_tier="enterprise")
        slow = await build.pod("us-east-slow", sim_prefill_per_token_s=0.05, **POD)
        fast = await build.pod("us-east-fast", sim_prefill_per_token_s=0.00001, **POD)
        region = await build.region(
            region_settings(glob.address, [slow, fast], routing_policy="round_robin", hedge_ttft_ms=200)
        )
        await wait_until(lambda: len(region.pool.healthy_pods) == 2, what="pods up")
        request = chat_service_pb2.ChatRequest(
            start=chat_service_pb2.ChatStart(
                model="auto",
                messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="word " * 60)],
                sampling=common_pb2.SamplingParams(max_tokens=8),
            )
        )
        async with open_channel(region.address) as channel:
            call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
                metadata=(("authorization", f"Bearer {DEV_KEY}"),)
            )
            await call.write(request)
            await call.done_writing()
            events = [event async for event in call]
        started = next(event.started for event in events if event.HasField("started"))
        assert started.pod_id == "us-east-fast"
        usage = next(event.usage.usage for event in events if event.HasField("usage"))
        assert usage.output_tokens == 8
        assert usage.input_tokens == sim(fast).pool.query_tokens
        await wait_until(lambda: sim(slow).load().running + sim(slow).load().waiting == 0, what="abort")
