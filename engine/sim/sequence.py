"""One generation inside the simulator: its reply plan, output position,
progress through the KV cache (vLLM's ``num_computed_tokens``), stop
handling, injected faults and event queue."""

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
from engine.sim.metrics import RequestTimeline
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

    Progress is vLLM's: ``token_ids`` are the context and the output so far,
    ``computed_tokens`` of them have their KV in the cache. A step computes
    some more (:meth:`compute`); once all are computed the sequence samples
    its next token. Preemption (:meth:`preempt`) forgets the KV but keeps
    the output, so readmission recomputes prompt and output and decoding
    continues where it stopped: the stream never notices.
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
        self.computed_tokens = 0
        # True once all tokens were computed and one was sampled (decode phase).
        self.decoding = False
        self.started = False
        self.preemptions = 0
        self.timeline = RequestTimeline()
        # Prefix-cache hits at first admission: what the usage reports.
        self.cached_tokens = 0
        self.output_tokens = 0
        self.finished = False
        self.finish_reason: FinishReason | None = None
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
    def tokens_to_compute(self) -> int:
        """Tokens whose KV is still missing: 1 while decoding, the rest of the
        prompt (and recomputed output) while prefilling."""
        return len(self.token_ids) - self.computed_tokens

    def admit(self, allocation: KvAllocation | None) -> None:
        """Enter the batch holding ``allocation``, its prefix-cache hits
        already computed. Only the first admission emits GenerationStarted;
        a sequence with nothing left to produce (``allocation`` None: a
        continuation already at its limit) finishes at once."""
        self.allocation = allocation
        self.computed_tokens = allocation.cached_tokens if allocation else 0
        if self.started:
            return
        self.started = True
        self.cached_tokens = self.computed_tokens
        self.events.put_nowait(GenerationStarted(self.prompt_tokens, self.cached_tokens))
        if self.remaining_tokens == 0:
            self.finish(self._end_reason)

    def preempt(self) -> None:
        """Leave the batch, recompute-style: the caller frees the blocks; the
        output produced so far stays and is recomputed on readmission."""
        self.allocation = None
        self.computed_tokens = 0
        self.decoding = False
        self.preemptions += 1

    def compute(self, num_tokens: int) -> bool:
        """Record a step that computed ``num_tokens`` more tokens; once none
        is missing, sample the next token. True when the sequence ended."""
        self.computed_tokens += num_tokens
        if self.computed_tokens < len(self.token_ids):
            return False
        self.decoding = True
        return self.decode_one()

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

    def end_for_lack_of_room(self) -> None:
        """End with LENGTH because the KV pool cannot hold the next token even
        with the whole batch to itself; text held back for a possible stop
        sequence is streamed first."""
        text = self._detokenizer.flush()
        if text:
            self.events.put_nowait(GeneratedTokens((), text, self._position))
        self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, matched_stop: str = "") -> None:
        """Emit the final event; later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        self.finish_reason = reason
        self.events.put_nowait(
            GenerationFinished(
                reason, self.prompt_tokens, self.output_tokens, self.cached_tokens, matched_stop
            )
        )
