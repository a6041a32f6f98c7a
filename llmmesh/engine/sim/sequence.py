"""One generation inside the simulator: its reply plan, output position,
progress through the KV cache (vLLM's ``num_computed_tokens``), stop
handling, injected faults and event queue."""

from __future__ import annotations

import asyncio
import hashlib

from llmmesh.core.errors import InvalidArgument, MeshError, Reason
from llmmesh.engine.backend import (
    FinishReason,
    GeneratedTokens,
    GenerationEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStarted,
    TokenLogprobs,
    ToolCallPart,
    TopLogprob,
)
from llmmesh.engine.sim.detokenizer import StopAwareDetokenizer
from llmmesh.engine.sim.distribution import SampledToken
from llmmesh.engine.sim.faults import FaultPlan, injected_failure
from llmmesh.engine.sim.guided import guided_reply
from llmmesh.engine.sim.kv_blocks import KvAllocation
from llmmesh.engine.sim.metrics import RequestTimeline
from llmmesh.engine.sim.model_tokenizer import PromptTokenizer
from llmmesh.engine.sim.sampler import DeterministicSampler, OutputHistory
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.tool_calls import ToolCallParser

# What the event queue carries: the backend's events, or the error that ends
# a failed generation in place of its GenerationFinished.
SequenceEvent = GenerationEvent | MeshError


class SimSequence:
    """A request from submission to finish.

    Output positions count resumed tokens: a continuation of ``k`` tokens
    produces positions ``k, k+1, …``. The reply ends at the first of its
    natural length (STOP, or TOOL_CALLS for a reply of tool calls),
    ``max_tokens`` or the context window (LENGTH), or a stop sequence (STOP
    with ``matched_stop``). A guided reply (:mod:`engine.sim.guided`) is
    fixed whole before the first token; its tool-call text streams as
    tool-call parts, not as text. With ``logprobs`` every token carries its
    log probabilities. Under a :class:`FaultPlan`
    it may instead fail (its last queue item is then a ``MeshError``) or
    stall (it stops decoding and waits for an abort). ``prompts`` tokenized
    the prompt (``tokenizer``, which writes the reply, by default).

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
        prompts: PromptTokenizer | None = None,
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
        self._tokenizer = tokenizer
        sampling = request.sampling
        self._plan = sampler.plan(request.prompt_token_ids, sampling)
        self._history = OutputHistory.of(request.resume_output_token_ids)
        self._detokenizer = StopAwareDetokenizer(tokenizer, sampling.stop, request.resume_output_token_ids)
        self._position = len(request.resume_output_token_ids)
        natural_length, natural_reason = self._plan.natural_length, FinishReason.STOP
        self._guided = guided_reply(
            request.prompt_token_ids, sampling, self._plan, sampler, tokenizer, prompts
        )
        self._tool_calls: ToolCallParser | None = None
        if self._guided is not None:
            guided_ids = tuple(token.token_id for token in self._guided.tokens)
            if guided_ids[: self._position] != request.resume_output_token_ids:
                raise InvalidArgument(
                    Reason.INVALID_REQUEST,
                    "the resumed output is not the start of this request's guided reply",
                    metadata={"param": "resume_output_token_ids"},
                )
            # The grammar ends a guided reply, ignore_eos or not.
            natural_length = len(guided_ids)
            if self._guided.tool_calls:
                natural_reason = FinishReason.TOOL_CALLS
                self._tool_calls = ToolCallParser(self._guided.named, self._call_id)
                self._tool_calls.prime(self._detokenizer.resumed_text)
        room = context_window - len(request.prompt_token_ids)
        max_tokens = sampling.max_tokens
        limit = room if max_tokens is None else min(max_tokens, room)
        if natural_length <= limit:
            self._end_position, self._end_reason = natural_length, natural_reason
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
        if self._guided is not None:
            sampled = self._guided.tokens[self._position]
        else:
            sampled = self._sampler.sample(self._plan, self._position, self._history)
        token_id = sampled.token_id
        offset = self._position
        self._position += 1
        self.output_tokens += 1
        self.token_ids.append(token_id)
        self._history.append(token_id)
        text = self._detokenizer.push(token_id)
        ended = bool(self._detokenizer.matched_stop) or self._position >= self._end_position
        if ended:
            text += self._detokenizer.flush()
        logprobs = (self._logprobs(sampled),) if self.request.sampling.logprobs else ()
        text, parts = self._split_tool_calls(text)
        self.events.put_nowait(GeneratedTokens((token_id,), text, offset, parts, logprobs))
        if self._detokenizer.matched_stop:
            self.finish(FinishReason.STOP, self._detokenizer.matched_stop)
        elif ended:
            self.finish(self._end_reason)
        return ended

    def end_for_lack_of_room(self) -> None:
        """End with LENGTH because the KV pool cannot hold the next token even
        with the whole batch to itself; text held back for a possible stop
        sequence is streamed first."""
        text, parts = self._split_tool_calls(self._detokenizer.flush())
        if text or parts:
            self.events.put_nowait(GeneratedTokens((), text, self._position, parts))
        self.finish(FinishReason.LENGTH)

    def _split_tool_calls(self, text: str) -> tuple[str, tuple[ToolCallPart, ...]]:
        """Content text, and the tool-call parts the text makes instead
        when the reply is tool calls."""
        if self._tool_calls is None or not text:
            return text, ()
        return "", tuple(self._tool_calls.feed(text))

    def _call_id(self, index: int) -> str:
        """A call id that every pod gives the same reply."""
        digest = hashlib.blake2b(self._plan.digest + index.to_bytes(4, "little"), digest_size=12)
        return "call_" + digest.hexdigest()

    def _logprobs(self, sampled: SampledToken) -> TokenLogprobs:
        token, raw = self._token_text(sampled.token_id)
        top: list[TopLogprob] = []
        for top_id, logprob in sampled.top:
            top_token, top_raw = self._token_text(top_id)
            top.append(TopLogprob(top_id, top_token, logprob, top_raw))
        return TokenLogprobs(sampled.token_id, token, sampled.logprob, raw, tuple(top))

    def _token_text(self, token_id: int) -> tuple[str, bytes]:
        """A token's text (a lone byte of a character shows as U+FFFD) and bytes."""
        raw = self._tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), raw

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
