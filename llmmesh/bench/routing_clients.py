"""Clients and the load driver of ``llmmesh bench routing``.

Two clients send a :class:`~llmmesh.bench.routing_workload.Turn` with its
whole history: :class:`RegionChatClient` to a region's ``ChatService``
(gRPC, ``authorization: Bearer`` metadata) and :class:`RouterChatClient` to
an OpenAI-compatible HTTP router. :func:`run_conversations` drives them:
``concurrency`` users, each taking the next conversation and sending its
turns one after the other. :class:`PrefixCacheProbe` reads the pods' own
prefix-cache counters, the same way for every system.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import grpc.aio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmmesh.bench.loadgen import LevelRun, ProgressCallback
from llmmesh.bench.openai_client import OpenAIChatClient, streamed_body
from llmmesh.bench.routing_workload import Conversation, Turn
from llmmesh.bench.stats import RequestRecord
from llmmesh.v1 import chat_service_pb2 as pb
from llmmesh.v1 import chat_service_pb2_grpc as pb_grpc
from llmmesh.v1 import common_pb2

# A proxy from the environment must not sit between the benchmark and a
# region on localhost.
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]
_ROLES = {
    "system": common_pb2.CHAT_ROLE_SYSTEM,
    "user": common_pb2.CHAT_ROLE_USER,
    "assistant": common_pb2.CHAT_ROLE_ASSISTANT,
}
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"


class TurnClient(Protocol):
    """A client of one system under test."""

    async def chat(self, turn: Turn) -> RequestRecord:
        """Send ``turn``, stream its tokens and return what was seen;
        failures are recorded in the record, not raised."""
        ...

    async def close(self) -> None: ...


def chat_start(turn: Turn, model: str) -> pb.ChatRequest:
    """The start message of ``turn``: greedy, ``ignore_eos``, stateless (the
    history travels in the messages)."""
    return pb.ChatRequest(
        start=pb.ChatStart(
            request_id=turn.turn_id,
            model=model,
            messages=[
                common_pb2.ChatMessage(role=_ROLES[role], content=text) for role, text in turn.messages
            ],
            sampling=common_pb2.SamplingParams(max_tokens=turn.max_tokens, temperature=0.0, ignore_eos=True),
        )
    )


class RegionChatClient:
    """Streams turns from the region ``ChatService`` at ``address``, over one
    channel, authenticated by ``api_key``; each turn is bounded by a gRPC
    deadline of ``request_timeout_s``."""

    def __init__(self, address: str, api_key: str, model: str, request_timeout_s: float) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub: pb_grpc.ChatServiceAsyncStub = pb_grpc.ChatServiceStub(self._channel)  # type: ignore[assignment]
        self._metadata = (("authorization", f"Bearer {api_key}"),)
        self._model = model
        self._timeout_s = request_timeout_s

    async def chat(self, turn: Turn) -> RequestRecord:
        """See :class:`TurnClient`. A stream that ends without ``finished``,
        or with an ``error`` event, is a failure."""
        record = RequestRecord(sent_at=time.perf_counter())
        call = self._stub.Chat(metadata=self._metadata, timeout=self._timeout_s)
        try:
            await call.write(chat_start(turn, self._model))
            await call.done_writing()
            async for response in call:
                kind = response.WhichOneof("event")
                if kind == "started":
                    record.served_by = response.started.pod_id
                elif kind == "delta":
                    record.add_tokens(time.perf_counter(), len(response.delta.token_ids))
                elif kind == "finished":
                    record.finish(time.perf_counter())
                elif kind == "error":
                    record.fail(f"{response.error.reason}: {response.error.message}")
        except grpc.aio.AioRpcError as err:
            record.fail(f"{err.code().name}: {err.details()}")
        if record.finished_at is None:
            record.fail("the stream ended without a finished event")
        return record

    async def close(self) -> None:
        await self._channel.close()


def chat_body(model: str, turn: Turn) -> dict[str, Any]:
    """The OpenAI request body of ``turn`` (see
    :func:`llmmesh.bench.openai_client.streamed_body`)."""
    messages = [{"role": role, "content": text} for role, text in turn.messages]
    return streamed_body(model, messages, turn.max_tokens)


class RouterChatClient:
    """Streams turns from an OpenAI-compatible server at ``base_url`` through
    :class:`~llmmesh.bench.openai_client.OpenAIChatClient`."""

    def __init__(self, base_url: str, model: str, max_connections: int, request_timeout_s: float) -> None:
        self._client = OpenAIChatClient(base_url, model, max_connections, request_timeout_s)

    async def chat(self, turn: Turn) -> RequestRecord:
        """See :class:`TurnClient`."""
        return await self._client.stream(chat_body(self._client.model, turn))

    async def close(self) -> None:
        await self._client.close()


async def run_conversations(
    client: TurnClient,
    conversations: Sequence[Conversation],
    concurrency: int,
    on_progress: ProgressCallback | None = None,
    ramp_s: float = 0.0,
) -> LevelRun:
    """Run ``conversations`` through ``client`` with ``concurrency`` users.

    User i starts ``i * ramp_s / concurrency`` seconds after the first, so
    the users arrive over ``ramp_s`` rather than in one burst. A user takes
    the next conversation not yet started and sends its turns in order, each
    as soon as the previous one ended (a failed turn does not stop the
    conversation: the history is the workload's, not the reply).
    ``on_progress(done, total)`` counts turns. Records come back in the
    workload's order; the wall time runs from the first turn sent to the
    last one ended."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be positive, got {concurrency}")
    if ramp_s < 0:
        raise ValueError(f"ramp_s must not be negative, got {ramp_s}")
    records: list[list[RequestRecord]] = [[] for _ in conversations]
    total = sum(len(conversation.turns) for conversation in conversations)
    next_index = 0
    done = 0

    async def user(delay_s: float) -> None:
        nonlocal next_index, done
        await asyncio.sleep(delay_s)
        while next_index < len(conversations):
            index = next_index
            next_index += 1
            for turn in conversations[index].turns:
                try:
                    record = await client.chat(turn)
                except Exception as exc:
                    record = RequestRecord(sent_at=time.perf_counter())
                    record.fail(f"client raised {type(exc).__name__}: {exc}")
                records[index].append(record)
                done += 1
                if on_progress is not None:
                    on_progress(done, total)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for index in range(min(concurrency, len(conversations))):
            group.create_task(user(index * ramp_s / concurrency))
    return LevelRun([record for turns in records for record in turns], time.perf_counter() - started)


def turn_trace(
    conversations: Sequence[Conversation], records: Sequence[RequestRecord], started_at: float
) -> list[dict[str, Any]]:
    """One JSON-ready line per measured turn, in the workload's order: which
    tenant and turn it was, when it was sent (from ``started_at``), its TTFT,
    the pod that served it and any error; for finding where a tail comes from."""
    turns = [turn for conversation in conversations for turn in conversation.turns]
    return [
        {
            "turn_id": turn.turn_id,
            "tenant": turn.tenant,
            "sent_s": round(record.sent_at - started_at, 4),
            "ttft_s": None if record.ttft_s is None else round(record.ttft_s, 4),
            "output_tokens": record.output_tokens,
            "pod": record.served_by,
            "error": record.error,
        }
        for turn, record in zip(turns, records, strict=True)
    ]


@dataclass(frozen=True)
class PrefixCacheCounts:
    """Prompt tokens looked up in the prefix cache and tokens found there."""

    queries: float = 0.0
    hits: float = 0.0

    def __add__(self, other: PrefixCacheCounts) -> PrefixCacheCounts:
        return PrefixCacheCounts(self.queries + other.queries, self.hits + other.hits)

    def __sub__(self, other: PrefixCacheCounts) -> PrefixCacheCounts:
        return PrefixCacheCounts(self.queries - other.queries, self.hits - other.hits)

    @property
    def hit_rate(self) -> float | None:
        """Hits over queries; None with no queries."""
        return self.hits / self.queries if self.queries > 0 else None


def parse_prefix_counts(text: str) -> PrefixCacheCounts:
    """The prefix-cache counters in a Prometheus exposition, summed over
    every label set (a pod may report per engine)."""
    totals = {PREFIX_QUERIES: 0.0, PREFIX_HITS: 0.0}
    names = {name: name for name in totals} | {f"{name}_total": name for name in totals}
    # By sample name, whatever family the parser put a sample in (it does
    # not always group a counter's ``_total`` samples under their TYPE line).
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return PrefixCacheCounts(totals[PREFIX_QUERIES], totals[PREFIX_HITS])


class PrefixCacheProbe:
    """Reads the prefix-cache counters of every pod's ``/metrics``."""

    def __init__(self, metrics_urls: Sequence[str], timeout_s: float = 10.0) -> None:
        self._urls = list(metrics_urls)
        self._timeout_s = timeout_s

    async def read(self) -> PrefixCacheCounts:
        """The counters summed over the pods. Raises httpx.HTTPError when a
        pod does not answer."""
        async with httpx.AsyncClient(timeout=self._timeout_s, trust_env=False) as http:
            total = PrefixCacheCounts()
            for url in self._urls:
                response = await http.get(url)
                response.raise_for_status()
                total = total + parse_prefix_counts(response.text)
            return total
