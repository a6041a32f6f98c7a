"""KvEventSubscriber against real in-process simulator pods: a broken stream
resumes where it stopped (nothing lost, nothing twice), a restarted pod or a
gap resets the pod in the index."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.grpcserver import GrpcServer, open_channel
from llmmesh.engine.backend import ChatTurn, GenerationRequest, SamplingOptions
from llmmesh.engine.server import start_engine
from llmmesh.engine.servicer import SERVICE_NAME, EngineServicer
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.placement.kv_events_feed import Backoff, KvEventFeeds, KvEventSubscriber
from llmmesh.region.placement.kv_index import ApplyOutcome, InMemoryPrefixIndex
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc
from tests.engine.support import collect
from tests.region.support import (
    POD,
    QUESTION,
    Stub,
    chat,
    expected_resident,
    generate,
    pod_settings,
    sim,
    tokenize,
)
from tests.stack import wait_until

QUICK = Backoff(initial_s=0.01, max_s=0.1)


class RecordingIndex(InMemoryPrefixIndex):
    """Remembers the sequence of every event delivered to it."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[int] = []

    async def apply(self, pod_id: str, batch: engine_service_pb2.StreamKvEventsResponse) -> ApplyOutcome:
        self.delivered.extend(event.sequence for event in batch.events)
        return await super().apply(pod_id, batch)


class ServedBackend:
    """A simulator backend whose gRPC server can be cut and brought back on
    the same port, while the backend (and its event log) lives on."""

    def __init__(self) -> None:
        self.backend = SimBackend(POD)
        self.server: GrpcServer | None = None
        self.port = 0

    async def serve(self) -> str:
        servicer = EngineServicer(self.backend, POD.load_interval_ms)

        def register(server: grpc.aio.Server) -> None:
            engine_service_pb2_grpc.add_EngineServiceServicer_to_server(servicer, server)

        self.server = GrpcServer(register, [SERVICE_NAME], "127.0.0.1", self.port)
        address = await self.server.start()
        self.port = int(address.rsplit(":", 1)[1])
        return address

    async def cut(self) -> None:
        """Stop serving at once: open streams fail with UNAVAILABLE."""
        assert self.server is not None
        await self.server.stop(0)

    async def generate_offline(self, text: str) -> None:
        """A generation straight on the backend, while nobody follows."""
        prompt = await self.backend.tokenize([ChatTurn("user", text)], True)
        request = GenerationRequest(
            f"req-{uuid.uuid4().hex[:8]}", tuple(prompt), SamplingOptions(max_tokens=4)
        )
        await collect(self.backend, request)


@pytest_asyncio.fixture
async def served() -> AsyncIterator[ServedBackend]:
    engine = ServedBackend()
    await engine.backend.start()
    yield engine
    if engine.server is not None:
        await engine.server.stop(0)
    await engine.backend.close()


def caught_up(subscriber: KvEventSubscriber, backend: SimBackend) -> bool:
    cursor = subscriber.cursor
    return (
        cursor is not None
        and cursor.instance_id == backend.info().instance_id
        and cursor.last_sequence == backend.kv_event_log.last_sequence
    )


@pytest.mark.asyncio
async def test_a_broken_stream_resumes_without_gap_or_duplicate(served: ServedBackend) -> None:
    index = RecordingIndex()
    address = await served.serve()
    async with open_channel(address) as channel:
        stub = Stub(channel)
        subscriber = KvEventSubscriber("pod-a", stub, index, QUICK)
        subscriber.start()
        try:
            await generate(stub, QUESTION)
            await wait_until(lambda: caught_up(subscriber, served.backend), 20, "first events applied")
            before = served.backend.kv_event_log.last_sequence
            await served.cut()
            for n in range(3):
                await served.generate_offline(f"While the feed is down, question {n}?")
            assert served.backend.kv_event_log.last_sequence > before
            await served.serve()
            await wait_until(lambda: caught_up(subscriber, served.backend), 20, "missed events applied")
        finally:
            await subscriber.stop()
    last = served.backend.kv_event_log.last_sequence
    assert index.delivered == list(range(1, last + 1))
    stats = subscriber.stats
    assert (stats.resets, stats.duplicates, stats.events_applied) == (0, 0, last)
    assert stats.connects >= 2 and stats.failures >= 1
    assert await index.block_count("pod-a") == len(served.backend.pool.resident_hashes())


@pytest.mark.asyncio
async def test_a_new_subscriber_resumes_from_the_index(served: ServedBackend) -> None:
    index = RecordingIndex()
    address = await served.serve()
    async with open_channel(address) as channel:
        stub = Stub(channel)
        first = KvEventSubscriber("pod-a", stub, index, QUICK)
        first.start()
        await generate(stub, QUESTION)
        await wait_until(lambda: caught_up(first, served.backend), 20, "first subscriber caught up")
        await first.stop()
        await generate(stub, chat("Another question, asked while nobody follows."))
        second = KvEventSubscriber("pod-a", stub, index, QUICK)
        second.start()
        try:
            await wait_until(lambda: caught_up(second, served.backend), 20, "second subscriber caught up")
        finally:
            await second.stop()
    last = served.backend.kv_event_log.last_sequence
    assert index.delivered == list(range(1, last + 1))
    assert (second.stats.resets, second.stats.duplicates) == (0, 0)


@pytest.mark.asyncio
async def test_a_restarted_pod_resets_its_blocks() -> None:
    index = InMemoryPrefixIndex()
    first = await start_engine(POD)
    port = int(first.address.rsplit(":", 1)[1])
    async with open_channel(first.address) as channel:
        stub = Stub(channel)
        subscriber = KvEventSubscriber("pod-a", stub, index, QUICK)
        subscriber.start()
        try:
            await generate(stub, QUESTION)
            await wait_until(lambda: caught_up(subscriber, sim(first)), 20, "first process followed")
            prompt = await tokenize(stub, QUESTION)
            assert "pod-a" in await index.match(prompt)
            await first.stop(0.5)
            second = await start_engine(pod_settings(port=port))
            try:
                await wait_until(lambda: caught_up(subscriber, sim(second)), 20, "second process followed")
                assert subscriber.stats.resets == 1
                assert await index.match(prompt) == {}
                await generate(stub, QUESTION)
                await wait_until(lambda: caught_up(subscriber, sim(second)), 20, "new events applied")
                assert (await index.match(prompt)).get("pod-a") == expected_resident(second, prompt)
            finally:
                await second.stop(0.5)
        finally:
            await subscriber.stop()


@pytest.mark.asyncio
async def test_a_subscriber_that_fell_behind_the_retention_resets() -> None:
    index = InMemoryPrefixIndex()
    pod = await start_engine(pod_settings(kv_event_retention=8))
    try:
        async with open_channel(pod.address) as channel:
            stub = Stub(channel)
            first = KvEventSubscriber("pod-a", stub, index, QUICK)
            first.start()
            await generate(stub, QUESTION, max_tokens=2)
            await wait_until(lambda: caught_up(first, sim(pod)), 20, "followed")
            await first.stop()
            for n in range(12):
                await generate(stub, chat(f"Question number {n}: how do {n} pears grow?"), max_tokens=2)
            second = KvEventSubscriber("pod-a", stub, index, QUICK)
            second.start()
            try:
                await wait_until(lambda: caught_up(second, sim(pod)), 20, "followed after the gap")
            finally:
                await second.stop()
            assert second.stats.resets == 1
            assert await index.match(await tokenize(stub, QUESTION)) == {}
    finally:
        await pod.stop(0.5)


@pytest.mark.asyncio
async def test_a_subscriber_gives_up_after_its_failure_limit() -> None:
    # A port nothing listens on: every attempt fails with UNAVAILABLE.
    served = ServedBackend()
    address = await served.serve()
    await served.cut()
    async with open_channel(address) as channel:
        subscriber = KvEventSubscriber(
            "pod-a", Stub(channel), InMemoryPrefixIndex(), QUICK, max_consecutive_failures=3
        )
        await subscriber.run()
    assert (subscriber.stats.failures, subscriber.stats.batches) == (3, 0)


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.2)
    assert 0.08 <= backoff.delay(1) <= 0.1
    assert 0.16 <= backoff.delay(2) <= 0.2
    assert 0.8 <= backoff.delay(10) <= 1.0


@pytest.mark.asyncio
async def test_a_feed_whose_channel_is_closed_ends_and_a_closed_feeds_follows_no_pod() -> None:
    # A closed channel can never feed again: the subscriber ends quietly
    # instead of dying on grpc's UsageError, and feeds closed while a health
    # round was running start no subscriber on a channel about to close.
    index = InMemoryPrefixIndex()
    pool = EnginePool(["127.0.0.1:9"])
    (pod,) = pool.pods
    pod.pod_id = "pod-a"
    await pool.close()
    subscriber = KvEventSubscriber("pod-a", pod.stub, index, QUICK, max_consecutive_failures=3)
    async with asyncio.timeout(10):
        await subscriber.run()
    assert subscriber.stats.failures == 0
    feeds = KvEventFeeds(index, QUICK)
    await feeds.close()
    feeds.follow([pod])
    assert feeds.subscriber("pod-a") is None
