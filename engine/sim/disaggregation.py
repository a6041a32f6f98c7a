"""Prefill/decode disaggregation in the simulator.

A pod has a role (``pod_role``): ``both`` serves whole turns; ``prefill``
computes prompts' KV caches; ``decode`` takes a KV cache a prefill pod
computed and generates from it (and can serve a whole turn itself). The
region's router places each phase (:mod:`region.disaggregation`).

The prefill phase (``prefill_only``) runs the prompt through the pod's
scheduler like any generation limited to one token (vLLM's prefill
instances do the same), streams nothing, and finishes with a
:class:`~engine.backend.KvTransferSpec`: the context's tokens, its KV blocks
and the prefill pod's own prefix-cache hits.

The decode phase (``kv_transfer``) first waits for the transfer, modelled as
``sim_kv_transfer_overhead_s + sim_kv_transfer_per_block_s * blocks``, then
holds the context's full blocks in its prefix cache
(:meth:`engine.sim.kv_blocks.KvBlockPool.receive`) and generates: its
prefill computes only the tail after the last full block (a real decode
instance receives the tail too; that part is simplified). The turn is
billed as cached only for the prefill pod's own hits, and the decode pod's
lookup of the blocks it received stays out of its prefix-cache statistics
(vLLM counts tokens a connector loaded apart from cache hits too).

Defaults: 1 ms of setup per transfer (NIXL's handshake and notification)
and 0.1 ms per 16-token block, about 2 MiB of a Llama-3-8B-class KV cache
(128 KiB a token in bf16) over a 25 GB/s RDMA link. Against the prefill
model's 0.12 ms per token (1.9 ms a block), a transfer costs about 5% of
the prefill it replaces. Not modelled: link contention between concurrent
transfers, and the prefill pod keeping the blocks until they are pulled.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

from engine.backend import (
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
    KvTransferSpec,
)
from engine.sim.kv_blocks import KvBlockPool


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


async def receive(model: KvTransferModel, pool: KvBlockPool, request: GenerationRequest) -> None:
    """Wait for the transfer ``request.kv_transfer`` names, then hold the
    context's full blocks."""
    assert request.kv_transfer is not None
    await asyncio.sleep(model.duration_s(request.kv_transfer.blocks))
    pool.receive(request.context_token_ids)


def billed_as_transferred(event: GenerationEvent, spec: KvTransferSpec) -> GenerationEvent:
    """A decode phase's event with the prefill pod's cache hits as the
    cached prompt tokens: transferred blocks are not this pod's hits."""
    if isinstance(event, GenerationStarted | GenerationFinished):
        cached = min(event.cached_prompt_tokens, spec.cached_prompt_tokens)
        return dataclasses.replace(event, cached_prompt_tokens=cached)
    return event
