"""OpenAI's legacy ``text_completion`` objects, whole and streamed, and
their legacy log probabilities.

A whole completion is ``{"id": "cmpl-...", "object": "text_completion",
"created", "model", "system_fingerprint": null, "choices": [{"text",
"index", "logprobs", "finish_reason"}], "usage"}``; a streamed one is the
same object per event, each choice with the new text, then a chunk with
empty text and the finish reason, then (with ``include_usage``) a chunk
with no choices and the usage. With ``echo`` the text starts with the
prompt: a stream's first event carries it. Events are numbered 0, 1, 2, ...
as a chat stream's are (:mod:`edge.streams.framing`).

Log probabilities are the legacy shape: ``{"tokens", "token_logprobs",
"top_logprobs": [{token: logprob}], "text_offset"}``, offsets counted in
characters of the choice's text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmmesh.edge.chunks import (
    DONE,
    FINISH_REASONS,
    SseEvent,
    add_filter_results,
    sse_data,
    stream_chunk,
    usage_object,
)
from llmmesh.edge.reply_parts import ReplyCollector
from llmmesh.v1 import chat_service_pb2, common_pb2


def legacy_logprobs(entries: Iterable[common_pb2.TokenLogprob], offset: int = 0) -> dict[str, object]:
    """The legacy ``logprobs`` of ``entries``, whose text starts at
    character ``offset`` of the choice's text."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []
    for entry in entries:
        tokens.append(entry.token)
        token_logprobs.append(entry.logprob)
        top_logprobs.append({top.token: top.logprob for top in entry.top})
        text_offset.append(offset)
        offset += len(entry.token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def _choice(text: str, logprobs: dict[str, object] | None, finish_reason: str | None) -> dict[str, object]:
    return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}


class TextChunkStream:
    """Builds the events of one streamed text completion."""

    end_frame = DONE

    def __init__(
        self,
        completion_id: str,
        created: int,
        model: str,
        include_usage: bool,
        *,
        echo: str,
        logprobs: bool,
    ) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self.final_fields: dict[str, object] = {}
        self._echo = echo
        self._logprobs = logprobs
        self._next_id = 0
        # Characters of the choice's text sent so far: where the next token's offset starts.
        self._offset = 0

    def _chunk(self, choices: list[dict[str, object]]) -> dict[str, object]:
        return stream_chunk("text_completion", self, choices)

    def _event(self, payload: dict[str, object]) -> SseEvent:
        event = SseEvent(self._next_id, sse_data(payload))
        self._next_id += 1
        return event

    def opening(self) -> SseEvent | None:
        """With ``echo``, the prompt as the first text; else nothing."""
        if not self._echo:
            return None
        self._offset = len(self._echo)
        return self._event(self._chunk([_choice(self._echo, None, None)]))

    def delta(self, delta: chat_service_pb2.ChatDelta) -> SseEvent:
        logprobs = legacy_logprobs(delta.logprobs, self._offset) if self._logprobs else None
        self._offset += len(delta.text)
        return self._event(self._chunk([_choice(delta.text, logprobs, None)]))

    def finish(
        self,
        reason: common_pb2.FinishReason.ValueType,
        filtered_categories: Sequence[str] = (),
        usage: common_pb2.TokenUsage | None = None,
    ) -> SseEvent:
        """Empty text and the finish reason; a cancelled turn's carries the
        billed ``usage`` unless the usage chunk follows (as a chat stream's)."""
        choice = _choice("", None, FINISH_REASONS.get(reason, "stop"))
        add_filter_results(choice, filtered_categories)
        chunk = self._chunk([choice])
        chunk.update(self.final_fields)
        if reason == common_pb2.FINISH_REASON_CANCELLED and usage is not None and not self.include_usage:
            chunk["usage"] = usage_object(usage)
        return self._event(chunk)

    def usage(self, usage: common_pb2.TokenUsage) -> SseEvent:
        chunk = self._chunk([])
        chunk["usage"] = usage_object(usage)
        return self._event(chunk)

    def error(self, body: dict[str, object]) -> SseEvent:
        return self._event(body)


class TextFormat:
    """A text completion's answer: ``text_completion`` events or one object.
    ``echo`` is the prompt to put before the reply's text ("" for none);
    ``logprobs`` asks for the legacy log probabilities."""

    def __init__(self, *, echo: str, logprobs: bool) -> None:
        self._echo = echo
        self._logprobs = logprobs

    def frames(self, completion_id: str, created: int, model: str, include_usage: bool) -> TextChunkStream:
        return TextChunkStream(
            completion_id, created, model, include_usage, echo=self._echo, logprobs=self._logprobs
        )

    def whole(
        self,
        completion_id: str,
        created: int,
        model: str,
        reply: ReplyCollector,
        reason: common_pb2.FinishReason.ValueType,
        usage: common_pb2.TokenUsage,
        filtered_categories: Sequence[str],
    ) -> dict[str, object]:
        logprobs = legacy_logprobs(reply.logprobs, len(self._echo)) if self._logprobs else None
        choice = _choice(self._echo + "".join(reply.text), logprobs, FINISH_REASONS.get(reason, "stop"))
        add_filter_results(choice, filtered_categories)
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [choice],
            "usage": usage_object(usage),
        }
