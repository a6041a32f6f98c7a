"""One generation inside the simulator: its reply plan, output position,
stop handling, injected faults and event queue."""

from __future__ import annotations

import asyncio

from engine.backend import (
    FinishReason,
    GeneratedTokens,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
)
from engine.sim.detokenizer import StopAwareDetokenizer
from engine.sim.faults import FaultPlan, injected_failure
from engine.sim.kv_blocks import KvAllocation
from engine.sim.sampler import DeterministicSampler
from engine.sim.tokenizer import SimTokenizer
from llmmesh.errors import MeshError

# What the event queue carries: the backend's events, or the error that ends
# a failed generation in place of its GenerationFinished.
SequenceEvent = GenerationEvent | MeshError


class SimSequence:
    """A request from submission to finish.

    Output positions count resumed tokens: a continuation of ``k`` tokens
    produces positions ``k, k+1, …``. The reply ends at the first of its
    natural length (STOP), ``max_tokens`` or the context window (LENGTH), or a
    stop sequence (STOP with ``matched_stop``). Under a :class:`FaultPlan`
    it may instead fail (its last queue item is then a ``MeshError``) or
    stall (it stops decoding and waits for an abort).
    """

    def __init__(
        self,
        request: GenerationRequest,
        arrival: int,
        *,
        sampler: DeterministicSampler,
        tokenizer: SimTokenizer,
        context_window: int,
        faults: FaultPlan | None = None,
    ) -> None:
        self.request = request
        self.arrival = arrival
        self.events: asyncio.Queue[SequenceEvent] = asyncio.Queue()
        self.token_ids: list[int] = list(request.context_token_ids)
        self.allocation: KvAllocation | None = None
        self.cached_tokens = 0
        self.output_tokens = 0
        self.finished = False
        self._sampler = sampler
        self._plan = sampler.plan(request.prompt_token_ids, request.sampling)
        self._detokenizer = StopAwareDetokenizer(
            tokenizer, request.sampling.stop, request.resume_output_token_ids
        )
        self._position = len(request.resume_output_token_ids)
        room = context_window - len(request.prompt_token_ids)
        max_tokens = request.sampling.max_tokens
        limit = room if max_tokens is None else min(max_tokens, room)
        if self._plan.natural_length <= limit:
            self._end_position, self._end_reason = self._plan.natural_length, FinishReason.STOP
        else:
            self._end_position, self._end_reason = limit, FinishReason.LENGTH
        faults = faults or FaultPlan()
        self._fail_after = faults.failure_point(request, self.remaining_tokens)
        self._stall_after = faults.stall_point

    @property
    def stalled(self) -> bool:
        """True once an injected stall stops this sequence decoding."""
        return not self.finished and self._stall_after is not None and self.output_tokens >= self._stall_after

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_tokens(self) -> int:
        """Tokens prefilled: the prompt and any resumed output."""
        return len(self.request.context_token_ids)

    @property
    def remaining_tokens(self) -> int:
        """Output tokens this sequence will still produce, unless stopped early."""
        return max(0, self._end_position - self._position)

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def admit(self, allocation: KvAllocation | None) -> None:
        """Enter the batch with ``allocation``; a sequence with nothing left to
        produce (a continuation already at its limit) finishes at once."""
        self.allocation = allocation
        self.cached_tokens = allocation.cached_tokens if allocation else 0
        self.events.put_nowait(GenerationStarted(self.prompt_tokens, self.cached_tokens))
        if self.remaining_tokens == 0:
            self.finish(self._end_reason)

    def decode_one(self) -> bool:
        """Produce the next token and its events; True when the sequence ended
        (an injected failure ends it before the token)."""
        if self.output_tokens == self._fail_after:
            self.finished = True
            self.events.put_nowait(injected_failure(self.request_id, self.output_tokens))
            return True
        token_id = self._sampler.token_at(self._plan, self._position)
        offset = self._position
        self._position += 1
        self.output_tokens += 1
        self.token_ids.append(token_id)
        text = self._detokenizer.push(token_id)
        ended = bool(self._detokenizer.matched_stop) or self._position >= self._end_position
        if ended:
            text += self._detokenizer.flush()
        self.events.put_nowait(GeneratedTokens((token_id,), text, offset))
        if self._detokenizer.matched_stop:
            self.finish(FinishReason.STOP, self._detokenizer.matched_stop)
        elif ended:
            self.finish(self._end_reason)
        return ended

    def finish(self, reason: FinishReason, matched_stop: str = "") -> None:
        """Emit the final event; later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        self.events.put_nowait(
            GenerationFinished(
                reason, self.prompt_tokens, self.output_tokens, self.cached_tokens, matched_stop
            )
        )
