"""One vLLM generation's output as the pod streams it: content text, tool-call
parts and logprobs, per :class:`engine.backend.GeneratedTokens`.

The tool choice decides who reads the text:

- none (or no tools): all of it is content;
- named and required: the guided output is tool calls in the shared format
  of :mod:`engine.tool_calls`, read by its :class:`ToolCallParser`; none of
  it is content;
- auto: vLLM's tool parser for the model (:mod:`engine.vllm_engine.auto_tools`)
  splits content from calls.

A reply that made at least one call and ended at its end-of-sequence token
finishes ``TOOL_CALLS``; one cut short by ``max_tokens`` still finishes
``LENGTH``, and a cancelled one ``CANCELLED``. A continuation primes the
parser with the resumed output's text, so it goes on mid-call without
emitting again what the client already has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from llmmesh.core.errors import Internal, Reason
from llmmesh.engine.backend import (
    FinishReason,
    GeneratedTokens,
    SamplingOptions,
    TokenLogprobs,
    ToolCallPart,
    ToolChoiceMode,
)
from llmmesh.engine.tool_calls import ToolCallParser, ToolCallSyntaxError
from llmmesh.engine.vllm_engine.auto_tools import AutoToolCalls
from llmmesh.engine.vllm_engine.logprobs import TokenBytes, token_logprobs


def call_id(request_id: str, index: int) -> str:
    """A call's id on this pod; the region gives the client its own."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}"


class ReplyStream:
    """Turns vLLM's output deltas of one generation into :class:`GeneratedTokens`."""

    def __init__(
        self,
        request_id: str,
        sampling: SamplingOptions,
        token_bytes: TokenBytes | None,
        auto: AutoToolCalls | None = None,
    ) -> None:
        mode = sampling.tool_choice.mode
        self._guided_calls: ToolCallParser | None = None
        if sampling.tools and mode in (ToolChoiceMode.NAMED, ToolChoiceMode.REQUIRED):
            named = sampling.tool_choice.name if mode == ToolChoiceMode.NAMED else None
            self._guided_calls = ToolCallParser(named, lambda index: call_id(request_id, index))
        self._auto = auto
        self._logprobs = sampling.logprobs
        self._top = sampling.top_logprobs or 0
        self._token_bytes = token_bytes

    @property
    def made_calls(self) -> bool:
        if self._guided_calls is not None:
            return self._guided_calls.calls > 0
        return self._auto is not None and self._auto.calls > 0

    def prime(self, text: str, token_ids: Sequence[int]) -> None:
        """Read the resumed output of a continuation, emitting nothing."""
        if self._guided_calls is not None:
            parser = self._guided_calls
            self._read(lambda: parser.prime(text))
        elif self._auto is not None:
            self._auto.prime(text, list(token_ids))

    def tokens(
        self,
        token_ids: Sequence[int],
        text: str,
        offset: int,
        logprobs: Sequence[Mapping[int, Any] | None] | None = None,
        last: bool = False,
    ) -> GeneratedTokens | None:
        """The event for new output (``last``: the generation's final
        output, which flushes text a parser held back); None when there is
        nothing to send."""
        content, parts = self._split(text, token_ids)
        if last:
            more_content, more_parts = self._flush()
            content += more_content
            parts += more_parts
        if not token_ids and not content and not parts:
            return None
        entries: tuple[TokenLogprobs, ...] = ()
        if self._logprobs and token_ids:
            if logprobs is None or self._token_bytes is None:
                raise Internal(Reason.INTERNAL, "vLLM returned no logprobs for a request that asked for them")
            entries = token_logprobs(token_ids, logprobs, self._top, self._token_bytes)
        return GeneratedTokens(tuple(token_ids), content, offset, tuple(parts), entries)

    def finish_reason(self, vllm_reason: str | None, matched_stop: bool = False) -> FinishReason:
        """The reply's finish reason from vLLM's (``stop``, ``length``,
        ``abort``). Raises ``Internal`` for guided tool calls that ended at
        the end-of-sequence token unfinished, which only a broken grammar
        allows (a continuation whose resumed output its grammar rejected)."""
        if vllm_reason == "length":
            return FinishReason.LENGTH
        if vllm_reason == "abort":
            return FinishReason.CANCELLED
        calls = self._guided_calls
        if calls is not None and not matched_stop and not calls.complete:
            raise Internal(Reason.INTERNAL, "the guided tool calls ended before they were complete")
        return FinishReason.TOOL_CALLS if self.made_calls else FinishReason.STOP

    def _split(self, text: str, token_ids: Sequence[int]) -> tuple[str, list[ToolCallPart]]:
        if self._guided_calls is not None:
            parser = self._guided_calls
            return "", self._read(lambda: parser.feed(text))
        if self._auto is not None:
            return self._auto.feed(text, list(token_ids))
        return text, []

    def _flush(self) -> tuple[str, list[ToolCallPart]]:
        if self._auto is not None:
            return self._auto.flush()
        return "", []

    @staticmethod
    def _read(step: Any) -> Any:
        try:
            return step()
        except ToolCallSyntaxError as exc:
            # The grammar makes this impossible; if it happens, the engine
            # is broken, not the request.
            raise Internal(Reason.INTERNAL, f"the guided output broke the tool-call format: {exc}") from exc
