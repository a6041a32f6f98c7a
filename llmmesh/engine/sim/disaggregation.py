"""Prefill/decode disaggregation in the simulator.

A pod has a role (``pod_role``): ``both`` serves whole turns; ``prefill``
computes prompts' KV caches; ``decode`` takes a KV cache a prefill pod
computed and generates from it (and can serve a whole turn itself). The
region's router places each phase (:mod:`region.placement.disaggregation`).

The prefill phase (``prefill_only``) runs the prompt through the pod's
scheduler like any generation limited to one token (vLLM's prefill
instances do the same), streams nothing, and finishes with a
:class:`~engine.backend.KvTransferSpec`: the context's tokens, its KV blocks
and the prefill pod's own prefix-cache hits.

The decode phase (``kv_transfer``) is admitted as vLLM's NIXL connector
admits one on a decode instance: it first takes KV blocks for the
context's full blocks (:class:`KvReceiver`), waiting in arrival order
while the pod has no free batch slot or too few free blocks, then pulls
only the blocks it does not already hold (its own prefix-cache hits
travel no more), modelled as ``sim_kv_transfer_overhead_s +
sim_kv_transfer_per_block_s * blocks pulled``. The blocks stay pinned (not
evictable) until the generation is admitted to the batch and holds them
itself, so a busy pod cannot evict a received prompt before decoding it.
Its prefill then computes only the tail after the last full block (a real
decode instance receives the tail too; that part is simplified). A decode
phase still without room after :data:`RECEIVE_WAIT_S` computes its prompt
itself. The turn is billed as cached only for the prefill pod's own hits,
and the decode pod's lookup of the blocks it received stays out of its
prefix-cache statistics (vLLM counts tokens a connector loaded apart from
cache hits too).

Defaults: 1 ms of setup per transfer (NIXL's handshake and notification)
and 0.1 ms per 16-token block, about 2 MiB of a Llama-3-8B-class KV cache
(128 KiB a token in bf16) over a 25 GB/s RDMA link. Against the prefill
model's 0.12 ms per token (1.9 ms a block), a transfer costs about 5% of
the prefill it replaces. Not modelled: link contention between concurrent
transfers, the prefill pod keeping the blocks until they are pulled, and
received blocks being announced (and hit by others) while still in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from llmmesh.engine.backend import (
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
    KvTransferSpec,
)
from llmmesh.engine.sim.kv_blocks import KvAllocation, KvBlockPool

# How long a decode phase waits for a batch slot and KV blocks before it
# computes its prompt itself (simulated seconds, polled once a decode step).
RECEIVE_WAIT_S = 120.0


@dataclasses.dataclass(frozen=True)
class KvTransferModel:
    """How long a transfer of ``blocks`` KV blocks takes."""

    overhead_s: float
    per_block_s: float

    def duration_s(self, blocks: int) -> float:
        return self.overhead_s + self.per_block_s * blocks


def prefill_request(request: GenerationRequest) -> GenerationRequest:
    """The generation a prefill phase runs: the same context, one token."""
    sampling = dataclasses.replace(request.sampling, max_tokens=len(request.resume_output_token_ids) + 1)
    return dataclasses.replace(request, prefill_only=False, sampling=sampling)


async def prefill_events(
    events: AsyncIterator[GenerationEvent], request: GenerationRequest, pod_id: str, pool: KvBlockPool
) -> AsyncGenerator[GenerationEvent, None]:
    """The prefill phase's events: started, then finished with the handle;
    the token it sampled is dropped (the decode pod samples it again)."""
    context = len(request.context_token_ids)
    async for event in events:
        if isinstance(event, GenerationStarted):
            yield event
        elif isinstance(event, GenerationFinished):
            handle = KvTransferSpec(
                source_pod_id=pod_id,
                source_request_id=request.request_id,
                prompt_tokens=context,
                blocks=pool.blocks_for(context),
                cached_prompt_tokens=event.cached_prompt_tokens,
            )
            yield dataclasses.replace(event, output_tokens=0, kv_transfer=handle)


class KvReceiver:
    """A decode pod's side of KV transfers: room first, then the pull.

    ``has_slot()`` says whether the pod's batch could take one more
    sequence; ``poll_s`` is how often a waiting transfer looks again (a
    decode step). Transfers wait for room one at a time, in arrival order,
    and then pull concurrently."""

    def __init__(
        self, model: KvTransferModel, pool: KvBlockPool, has_slot: Callable[[], bool], poll_s: float
    ) -> None:
        self._model = model
        self._pool = pool
        self._has_slot = has_slot
        self._poll_s = poll_s
        self._room = asyncio.Lock()
        # Blocks pulled and transfers that found no room, for tests and metrics.
        self.pulled_blocks = 0
        self.no_room = 0

    async def receive(self, request: GenerationRequest) -> KvAllocation | None:
        """Take blocks for ``request.kv_transfer``'s context, pull those not
        resident here and return them pinned: the caller frees the pinned
        allocation once the generation holds the blocks (:func:`decode_events`).
        None when the context has no full block, or no room came in
        :data:`RECEIVE_WAIT_S` (the generation then computes its prompt)."""
        assert request.kv_transfer is not None
        block_size = self._pool.block_size
        full = len(request.context_token_ids) // block_size * block_size
        if full == 0:
            await asyncio.sleep(self._model.duration_s(0))
            return None
        allocation = await self._take_room(request.context_token_ids[:full])
        if allocation is None:
            self.no_room += 1
            return None
        pulled = len(allocation.blocks) - allocation.cached_tokens // block_size
        try:
            await asyncio.sleep(self._model.duration_s(pulled))
        except BaseException:
            self._pool.free(allocation)
            raise
        self.pulled_blocks += pulled
        return allocation

    async def _take_room(self, token_ids: Sequence[int]) -> KvAllocation | None:
        polls = max(1, math.ceil(RECEIVE_WAIT_S / self._poll_s))
        async with self._room:
            for _ in range(polls):
                if self._has_slot():
                    allocation = self._pool.allocate(token_ids, len(token_ids), counted=False)
                    if allocation is not None:
                        return allocation
                await asyncio.sleep(self._poll_s)
        return None


async def decode_events(
    events: AsyncIterator[GenerationEvent],
    pool: KvBlockPool,
    pinned: KvAllocation | None,
    spec: KvTransferSpec,
) -> AsyncGenerator[GenerationEvent, None]:
    """A decode phase's events, billed as :func:`billed_as_transferred`
    says; the received blocks are unpinned once the generation started
    (admitted, it holds them) or ended."""
    try:
        async for event in events:
            if pinned is not None and isinstance(event, GenerationStarted):
                pool.free(pinned)
                pinned = None
            yield billed_as_transferred(event, spec)
    finally:
        if pinned is not None:
            pool.free(pinned)


def billed_as_transferred(event: GenerationEvent, spec: KvTransferSpec) -> GenerationEvent:
    """A decode phase's event with the prefill pod's cache hits as the
    cached prompt tokens: transferred blocks are not this pod's hits."""
    if isinstance(event, GenerationStarted | GenerationFinished):
        cached = min(event.cached_prompt_tokens, spec.cached_prompt_tokens)
        return dataclasses.replace(event, cached_prompt_tokens=cached)
    return event
