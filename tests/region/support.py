"""Shared by the region's tests: in-process simulator pods and how to drive
them (the router tests: ``test_kv_index``, ``test_router``,
``test_kv_events_feed``), and a region's admission slots all held."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import cast

from llmmesh.engine.server import EnginePod
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.kv_blocks import full_block_hashes
from llmmesh.region.admission.fair_queue import FairQueue, Ticket
from llmmesh.region.placement.kv_index import PrefixIndex, ResetReason
from llmmesh.v1 import common_pb2, engine_service_pb2, engine_service_pb2_grpc
from tests.engine.support import FAST

BLOCK = FAST.block_size
POD = dataclasses.replace(FAST, pod_id="pod-a")
Stub = engine_service_pb2_grpc.EngineServiceStub


def pod_settings(**overrides: object) -> EngineSettings:
    return dataclasses.replace(POD, **overrides)  # type: ignore[arg-type]


def sim(pod: EnginePod) -> SimBackend:
    return cast(SimBackend, pod.backend)


def chat(*texts: str) -> list[common_pb2.ChatMessage]:
    """Messages alternating user and assistant, after a system prompt when
    the first text starts with 'system:'."""
    messages: list[common_pb2.ChatMessage] = []
    roles = [common_pb2.CHAT_ROLE_USER, common_pb2.CHAT_ROLE_ASSISTANT]
    for text in texts:
        if text.startswith("system:") and not messages:
            messages.append(common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content=text[7:]))
            continue
        turn = sum(1 for m in messages if m.role != common_pb2.CHAT_ROLE_SYSTEM)
        messages.append(common_pb2.ChatMessage(role=roles[turn % 2], content=text))
    return messages


async def tokenize(stub: Stub, messages: Sequence[common_pb2.ChatMessage]) -> list[int]:
    response = await stub.Tokenize(
        engine_service_pb2.TokenizeRequest(messages=messages, add_generation_prompt=True)
    )
    return list(response.token_ids)


@dataclasses.dataclass
class Reply:
    """What one generation reported."""

    pod_id: str
    cached_prompt_tokens: int
    text: str


async def generate(stub: Stub, messages: Sequence[common_pb2.ChatMessage], max_tokens: int = 8) -> Reply:
    """Run one generation through the pod's Generate stream to its end."""
    call = stub.Generate()
    await call.write(
        engine_service_pb2.GenerateRequest(
            start=engine_service_pb2.GenerateStart(
                request_id=f"req-{uuid.uuid4().hex[:12]}",
                messages=messages,
                sampling=common_pb2.SamplingParams(max_tokens=max_tokens, seed=7),
            )
        )
    )
    await call.done_writing()
    reply = Reply("", 0, "")
    async for response in call:
        if response.HasField("started"):
            reply.pod_id = response.started.pod_id
            reply.cached_prompt_tokens = response.started.cached_prompt_tokens
        elif response.HasField("delta"):
            reply.text += response.delta.text
    return reply


async def catch_up(index: PrefixIndex, pod_id: str, stub: Stub, last_sequence: int) -> list[ResetReason]:
    """Stream the pod's events after the index's cursor into the index until
    it holds ``last_sequence``; the reset reasons met on the way."""
    resets: list[ResetReason] = []
    cursor = await index.cursor(pod_id)
    call = stub.StreamKvEvents(
        engine_service_pb2.StreamKvEventsRequest(after_sequence=cursor.last_sequence if cursor else 0)
    )
    try:
        async with asyncio.timeout(10):
            async for batch in call:
                outcome = await index.apply(pod_id, batch)
                if outcome.reset is not None:
                    resets.append(outcome.reset)
                if outcome.cursor.last_sequence >= last_sequence:
                    break
    finally:
        call.cancel()
    return resets


def expected_resident(pod: EnginePod, token_ids: Sequence[int]) -> int:
    """Tokens of the leading blocks of ``token_ids`` the simulator holds."""
    resident = sim(pod).pool.resident_hashes()
    blocks = 0
    for block_hash in full_block_hashes(token_ids, sim(pod).pool.block_size):
        if block_hash not in resident:
            break
        blocks += 1
    return blocks * sim(pod).pool.block_size


QUESTION = chat("system:You answer questions about fruit.", "Tell me all about apples, please.")


@contextlib.asynccontextmanager
async def every_slot_held(queue: FairQueue) -> AsyncIterator[None]:
    """Every slot of ``queue`` taken for the block (as with every chat pod
    busy), so the next turn waits; released on the way out."""
    held: list[Ticket] = []
    for _ in range(queue.capacity + 1):
        if queue.stats().running >= queue.capacity:
            break
        held.append(await queue.acquire("enterprise"))
    try:
        yield
    finally:
        for ticket in held:
            queue.release(ticket)
