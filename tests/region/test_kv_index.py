"""The prefix index: fed by real in-process simulator pods, in memory and in
Redis, and checked against a model of a pod's cache by hypothesis.

Helpers shared with ``test_router`` and ``test_kv_events_feed`` live in
``tests.region.support``.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod, start_engine
from llmmesh.region.placement.kv_index import (
    InMemoryPrefixIndex,
    PodCursor,
    PrefixIndex,
    ResetReason,
    prefix_block_hashes,
)
from llmmesh.region.placement.kv_index_redis import RedisPrefixIndex
from llmmesh.region.placement.recent_prefixes import RecentPrefixes
from llmmesh.v1 import engine_service_pb2
from tests.region.support import (
    BLOCK,
    POD,
    QUESTION,
    Stub,
    catch_up,
    chat,
    expected_resident,
    generate,
    pod_settings,
    sim,
    tokenize,
)


@pytest_asyncio.fixture
async def pod() -> AsyncIterator[EnginePod]:
    engine_pod = await start_engine(POD)
    yield engine_pod
    await engine_pod.stop(0.5)


@pytest.fixture
def key_prefix() -> str:
    return f"llmmesh-test:kv:{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- real pods


@pytest.mark.asyncio
async def test_a_generated_prompt_is_found_on_its_pod(pod: EnginePod) -> None:
    index = InMemoryPrefixIndex()
    async with open_channel(pod.address) as channel:
        stub = Stub(channel)
        await generate(stub, QUESTION)
        await catch_up(index, "pod-a", stub, sim(pod).kv_event_log.last_sequence)
        prompt = await tokenize(stub, QUESTION)
        assert await index.match(prompt) == {"pod-a": len(prompt) // BLOCK * BLOCK}
        assert await index.block_count("pod-a") == len(sim(pod).pool.resident_hashes())
        # The pod reuses what the index says it holds (less the last token,
        # which an engine always computes).
        again = await generate(stub, QUESTION)
        assert again.cached_prompt_tokens == (len(prompt) - 1) // BLOCK * BLOCK
        assert await index.match(await tokenize(stub, chat("Something else entirely."))) == {}


@pytest.mark.asyncio
async def test_evicted_blocks_leave_the_index() -> None:
    small = await start_engine(pod_settings(kv_blocks=24))
    index = InMemoryPrefixIndex()
    try:
        async with open_channel(small.address) as channel:
            stub = Stub(channel)
            await generate(stub, QUESTION)
            prompt = await tokenize(stub, QUESTION)
            await generate(stub, chat("A rather longer question about pears, plums and cherries, please."))
            await catch_up(index, "pod-a", stub, sim(small).kv_event_log.last_sequence)
            held = expected_resident(small, prompt)
            assert held < len(prompt) // BLOCK * BLOCK, "the second prompt evicted some of the first"
            assert (await index.match(prompt)).get("pod-a", 0) == held
            assert await index.block_count("pod-a") == len(sim(small).pool.resident_hashes())
    finally:
        await small.stop(0.5)


@pytest.mark.asyncio
async def test_a_cleared_cache_empties_the_pod(pod: EnginePod) -> None:
    index = InMemoryPrefixIndex()
    async with open_channel(pod.address) as channel:
        stub = Stub(channel)
        await generate(stub, QUESTION)
        assert sim(pod).pool.reset()
        await catch_up(index, "pod-a", stub, sim(pod).kv_event_log.last_sequence)
        assert await index.match(await tokenize(stub, QUESTION)) == {}
        assert await index.block_count("pod-a") == 0


@pytest.mark.asyncio
async def test_a_restarted_pod_is_forgotten() -> None:
    first = await start_engine(POD)
    index = InMemoryPrefixIndex()
    async with open_channel(first.address) as channel:
        stub = Stub(channel)
        await generate(stub, QUESTION)
        await catch_up(index, "pod-a", stub, sim(first).kv_event_log.last_sequence)
        prompt = await tokenize(stub, QUESTION)
    assert "pod-a" in await index.match(prompt)
    await first.stop(0.5)
    second = await start_engine(POD)
    try:
        async with open_channel(second.address) as channel:
            stub = Stub(channel)
            resets = await catch_up(index, "pod-a", stub, 0)
            assert resets == [ResetReason.INSTANCE_CHANGED]
            assert await index.match(prompt) == {}
            await generate(stub, QUESTION)
            await catch_up(index, "pod-a", stub, sim(second).kv_event_log.last_sequence)
            assert await index.match(prompt) == {"pod-a": len(prompt) // BLOCK * BLOCK}
            cursor = await index.cursor("pod-a")
            assert cursor == PodCursor(
                second.backend.info().instance_id, sim(second).kv_event_log.last_sequence
            )
    finally:
        await second.stop(0.5)


@pytest.mark.asyncio
async def test_a_gap_drops_what_the_index_knew() -> None:
    forgetful = await start_engine(pod_settings(kv_event_retention=8))
    index = InMemoryPrefixIndex()
    try:
        async with open_channel(forgetful.address) as channel:
            stub = Stub(channel)
            await generate(stub, QUESTION, max_tokens=2)
            await catch_up(index, "pod-a", stub, sim(forgetful).kv_event_log.last_sequence)
            prompt = await tokenize(stub, QUESTION)
            assert "pod-a" in await index.match(prompt)
            # More events than the pod retains happen while nobody follows.
            for n in range(12):
                await generate(stub, chat(f"Question number {n}: how do {n} pears grow?"), max_tokens=2)
            resets = await catch_up(index, "pod-a", stub, sim(forgetful).kv_event_log.last_sequence)
            assert resets == [ResetReason.GAP]
            # The pod still holds the first prompt, but its events are gone.
            assert expected_resident(forgetful, prompt) > 0
            assert await index.match(prompt) == {}
    finally:
        await forgetful.stop(0.5)


@pytest.mark.services
@pytest.mark.asyncio
async def test_two_redis_indexes_agree(pod: EnginePod, redis_url: str, key_prefix: str) -> None:
    writer_client = redis.asyncio.Redis.from_url(redis_url)
    reader_client = redis.asyncio.Redis.from_url(redis_url)
    writer = RedisPrefixIndex(writer_client, key_prefix)
    reader = RedisPrefixIndex(reader_client, key_prefix)
    try:
        async with open_channel(pod.address) as channel:
            stub = Stub(channel)
            await generate(stub, QUESTION)
            last = sim(pod).kv_event_log.last_sequence
            await catch_up(writer, "pod-a", stub, last)
            prompt = await tokenize(stub, QUESTION)
            full = {"pod-a": len(prompt) // BLOCK * BLOCK}
            assert await writer.match(prompt) == full
            assert await reader.match(prompt) == full
            assert await reader.cursor("pod-a") == await writer.cursor("pod-a")
            assert await reader.block_count("pod-a") == len(sim(pod).pool.resident_hashes())
            # A second replica following the same pod from the start applies nothing twice.
            replay = stub.StreamKvEvents(engine_service_pb2.StreamKvEventsRequest(after_sequence=0))
            batch = await anext(aiter(replay))
            replay.cancel()
            outcome = await reader.apply("pod-a", batch)
            assert (outcome.applied, outcome.duplicates, outcome.reset) == (0, last, None)
            assert await writer.match(prompt) == full
            await reader.forget_pod("pod-a")
            assert await writer.match(prompt) == {}
            assert await writer.cursor("pod-a") is None
    finally:
        await writer.drop_all()
        await writer_client.aclose()
        await reader_client.aclose()


# ---------------------------------------------------------------- a model of a pod


def own_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A pod's own block hash: anything but the router's."""
    return hashlib.sha256(b"pod" + parent + struct.pack(f"<{len(tokens)}I", *tokens)).digest()


class ModelPod:
    """A pod's prefix cache reduced to which block hashes it holds, emitting
    the events a real one would."""

    def __init__(self, pod_id: str, block_size: int) -> None:
        self.pod_id = pod_id
        self.block_size = block_size
        self.resident: set[bytes] = set()
        self.sequence = 0

    def _event(self, **kind: object) -> engine_service_pb2.KvEvent:
        self.sequence += 1
        return engine_service_pb2.KvEvent(sequence=self.sequence, **kind)  # type: ignore[arg-type]

    def chain(self, token_ids: Sequence[int]) -> list[tuple[bytes, bytes, list[int]]]:
        """(parent, hash, tokens) of every full block."""
        blocks = []
        parent = b""
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            tokens = list(token_ids[start : start + self.block_size])
            block_hash = own_hash(parent, tokens)
            blocks.append((parent, block_hash, tokens))
            parent = block_hash
        return blocks

    def store(self, token_ids: Sequence[int]) -> list[engine_service_pb2.KvEvent]:
        """Cache every block of ``token_ids``, announcing runs of new ones."""
        events: list[engine_service_pb2.KvEvent] = []
        run: list[tuple[bytes, bytes, list[int]]] = []
        for block in [*self.chain(token_ids), None]:
            if block is None or block[1] in self.resident:
                if run:
                    stored = engine_service_pb2.BlockStored(
                        block_hashes=[h for _, h, _ in run],
                        parent_block_hash=run[0][0],
                        token_ids=[t for _, _, tokens in run for t in tokens],
                        block_size=self.block_size,
                    )
                    events.append(self._event(block_stored=stored))
                    self.resident.update(h for _, h, _ in run)
                    run = []
            else:
                run.append(block)
        return events

    def remove(self, picks: Sequence[int]) -> list[engine_service_pb2.KvEvent]:
        ordered = sorted(self.resident)
        gone = sorted({ordered[p % len(ordered)] for p in picks}) if ordered else []
        if not gone:
            return []
        self.resident.difference_update(gone)
        return [self._event(block_removed=engine_service_pb2.BlockRemoved(block_hashes=gone))]

    def clear(self) -> list[engine_service_pb2.KvEvent]:
        self.resident.clear()
        return [self._event(all_blocks_cleared=engine_service_pb2.AllBlocksCleared())]

    def resident_tokens(self, token_ids: Sequence[int]) -> int:
        held = 0
        for _, block_hash, _ in self.chain(token_ids):
            if block_hash not in self.resident:
                break
            held += self.block_size
        return held


tokens = st.lists(st.integers(0, 2), max_size=14)
operation: st.SearchStrategy[tuple[str, int, list[int], bool]] = st.one_of(
    st.tuples(st.just("store"), st.integers(0, 1), tokens, st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, 1), st.lists(st.integers(0, 99), max_size=3), st.booleans()),
    st.tuples(st.just("clear"), st.integers(0, 1), st.just([]), st.booleans()),
)


async def check_against_model(index: PrefixIndex, ops: list[tuple[str, int, list[int], bool]]) -> None:
    """Apply the ops' events (a flagged batch is delivered twice) and compare
    ``match`` with the model after each."""
    pods = [ModelPod("pod-x", 2), ModelPod("pod-y", 3)]
    queries: list[list[int]] = [[0, 1, 2, 0, 1, 2], [1] * 9]
    for kind, which, arg, redeliver in ops:
        pod = pods[which]
        if kind == "store":
            events = pod.store(arg)
            queries.append(arg)
        elif kind == "remove":
            events = pod.remove(arg)
        else:
            events = pod.clear()
        batch = engine_service_pb2.StreamKvEventsResponse(pod_id=pod.pod_id, instance_id="i-1", events=events)
        for _ in range(2 if redeliver else 1):
            await index.apply(pod.pod_id, batch)
        for query in queries[-4:]:
            expected = {p.pod_id: p.resident_tokens(query) for p in pods if p.resident_tokens(query)}
            assert await index.match(query) == expected, query
    for pod in pods:
        assert await index.block_count(pod.pod_id) == len(pod.resident)


@settings(max_examples=60)
@given(st.lists(operation, max_size=25))
def test_memory_index_matches_a_model_of_the_pods(ops: list[tuple[str, int, list[int], bool]]) -> None:
    asyncio.run(check_against_model(InMemoryPrefixIndex(), ops))


@pytest.mark.services
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(operation, max_size=15))
def test_redis_index_matches_a_model_of_the_pods(
    redis_url: str, ops: list[tuple[str, int, list[int], bool]]
) -> None:
    async def run() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        index = RedisPrefixIndex(client, f"llmmesh-test:kv:{uuid.uuid4().hex[:12]}")
        try:
            await check_against_model(index, ops)
        finally:
            await index.drop_all()
            await client.aclose()

    asyncio.run(run())


# ---------------------------------------------------------------- plain cases


def batch_of(
    instance: str, *events: engine_service_pb2.KvEvent, gap: bool = False
) -> engine_service_pb2.StreamKvEventsResponse:
    return engine_service_pb2.StreamKvEventsResponse(instance_id=instance, events=events, gap=gap)


@pytest.mark.asyncio
async def test_a_gap_batch_resets_and_a_contiguous_one_does_not() -> None:
    index = InMemoryPrefixIndex()
    pod = ModelPod("p", 2)
    await index.apply("p", batch_of("i", *pod.store([1, 2, 3, 4])))
    kept = pod.store([5, 6])
    outcome = await index.apply("p", batch_of("i", *kept, gap=True))
    assert outcome.reset is None, "the index already holds every event before this batch"
    assert await index.match([1, 2, 3, 4]) == {"p": 4}
    pod.sequence += 5  # events the index never saw
    outcome = await index.apply("p", batch_of("i", *pod.store([7, 8]), gap=True))
    assert outcome.reset is ResetReason.GAP
    assert await index.match([1, 2, 3, 4]) == {}
    assert await index.match([7, 8]) == {"p": 2}


def test_router_block_identity_depends_only_on_tokens_and_block_size() -> None:
    a = prefix_block_hashes([1, 2, 3, 4, 5], 2)
    assert len(a) == 2
    assert a == prefix_block_hashes([1, 2, 3, 4, 6], 2)
    assert a[0] != prefix_block_hashes([1, 2, 3, 4], 4)[0]
    assert prefix_block_hashes([9, 2, 3, 4], 2)[1] != a[1], "a block's identity includes its parent's"


def test_recent_prefixes_expire_and_are_bounded() -> None:
    now = [0.0]
    recent = RecentPrefixes(block_size=2, capacity=4, ttl_s=10.0, clock=lambda: now[0])
    recent.record([1, 2, 3, 4, 5], "pod-0")
    recent.record([1, 2, 9, 9], "pod-1")
    assert recent.match([1, 2, 3, 4, 7]) == {"pod-0": 4, "pod-1": 2}
    now[0] = 11.0
    assert recent.match([1, 2, 3, 4]) == {}
    recent.record([5, 5, 6, 6, 7, 7], "pod-2")
    assert len(recent) == 4
    recent.forget_pod("pod-2")
    assert recent.match([5, 5, 6, 6]) == {}
