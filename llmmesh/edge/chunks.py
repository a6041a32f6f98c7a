"""OpenAI ``chat.completion.chunk`` and ``chat.completion`` objects, and
their SSE framing.

Every event of a stream has a position, its id: the role chunk is 0, a
content chunk has its delta's sequence number (1, 2, ... in order), then
come the finish chunk and, with ``include_usage``, the usage chunk; so the
events are numbered 0, 1, 2, ... and a client that counted N of them has
read up to id N - 1. ``data: [DONE]`` has no id: it is the end marker, not
an event. The frames built here are ``data:`` lines only, byte-compatible
with OpenAI's; a stream whose client opted into event ids
(:mod:`edge.streams.framing`) gets each frame behind its ``id: N`` line
(:func:`with_id`) as it is sent.

A reply the region's output filter blocked ends as OpenAI ends one: a finish
chunk with ``finish_reason: "content_filter"``, then ``[DONE]``; a whole
``chat.completion`` has that finish reason on its choice. Either choice also
names the flagged categories as Azure OpenAI does,
``"content_filter_results": {"violence": {"filtered": true}}``, a field the
OpenAI SDKs keep as an extra without failing.

A delta with tool-call parts or log probabilities becomes a chunk with
``delta.tool_calls`` fragments and ``choices[0].logprobs``
(:mod:`edge.reply_parts`); a reply that called tools finishes with
``"tool_calls"``. A cancelled turn (``POST /v1/streams/{id}/cancel``, or a
client that left) finishes with ``"cancelled"``, a reason of the mesh's own
(OpenAI has none for it; its SDKs keep the string as it is), and its finish
chunk carries the usage that was billed, also when ``include_usage`` was
not asked (with it, the usage chunk follows as usual). A generation that
failed without an error event finishes with ``"error"``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from llmmesh.edge.reply_parts import ReplyCollector, logprobs_object, tool_call_fragment
from llmmesh.v1 import chat_service_pb2, common_pb2

DONE = b"data: [DONE]\n\n"

FINISH_REASONS: dict[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
    # OpenAI has no reason for these; a stopped or failed generation must
    # not read as a complete one.
    common_pb2.FINISH_REASON_CANCELLED: "cancelled",
    common_pb2.FINISH_REASON_ERROR: "error",
}


def usage_object(usage: common_pb2.TokenUsage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
    }


def blocked_categories(safety: chat_service_pb2.SafetyVerdict | None) -> list[str]:
    """The categories for which the output filter blocked a reply; none when
    it did not block it (a flag alone does not stop a reply)."""
    if safety is None or not safety.blocked:
        return []
    return list(safety.categories)


def add_filter_results(choice: dict[str, object], categories: Sequence[str]) -> None:
    """Name on ``choice`` the categories for which a filter blocked it, as Azure OpenAI does."""
    if categories:
        choice["content_filter_results"] = {c: {"filtered": True} for c in categories}


def sse_data(payload: dict[str, object]) -> bytes:
    """An event's frame: one ``data:`` line, as OpenAI frames every event."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def with_id(event_id: int, frame: bytes) -> bytes:
    """``frame`` behind its ``id: N`` line, for a client that opted into event ids."""
    return b"id: %d\n%s" % (event_id, frame)


class SseEvent(NamedTuple):
    """One framed SSE event (``data:`` only) and its id."""

    event_id: int
    frame: bytes


def stream_chunk(kind: str, frames: StreamFrames, choices: list[dict[str, object]]) -> dict[str, object]:
    """A streamed chunk of object ``kind`` of the stream ``frames`` builds:
    its constant fields and ``choices``, and a null usage with ``include_usage``."""
    chunk: dict[str, object] = {
        "id": frames.completion_id,
        "object": kind,
        "created": frames.created,
        "model": frames.model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if frames.include_usage:
        chunk["usage"] = None
    return chunk


Events = SseEvent | list[SseEvent]
"""What a stream's builder makes of one step: one event, or several in order
(a Responses stream opens an output item before its first delta)."""


class StreamFrames(Protocol):
    """What the stream hub needs of a streamed reply's events: chat chunks
    (:class:`ChunkStream`), text completion chunks (:mod:`edge.text_chunks`)
    or Responses events (:mod:`edge.response_events`). Event ids increase
    by one from 0; ``end_frame`` closes a stream that finished (``data:
    [DONE]``, or nothing)."""

    completion_id: str
    created: int
    model: str
    include_usage: bool
    final_fields: dict[str, object]
    end_frame: bytes

    def opening(self) -> Events | None:
        """The events before any delta, if the reply's shape has them."""

    def delta(self, delta: chat_service_pb2.ChatDelta) -> Events:
        """The events of one delta."""

    def finish(
        self,
        reason: common_pb2.FinishReason.ValueType,
        filtered_categories: Sequence[str] = (),
        usage: common_pb2.TokenUsage | None = None,
    ) -> Events:
        """The events with the finish reason."""

    def usage(self, usage: common_pb2.TokenUsage) -> SseEvent:
        """The usage event of ``include_usage``."""

    def error(self, body: dict[str, object]) -> Events:
        """An error object as the stream's last event(s)."""


def each_event(events: Events) -> list[SseEvent]:
    """``events`` as a list."""
    return [events] if isinstance(events, SseEvent) else events


class ReplyFormat(Protocol):
    """The shape a turn's answer takes: its stream's events, or one whole object."""

    def frames(self, completion_id: str, created: int, model: str, include_usage: bool) -> StreamFrames:
        """The builder of the streamed answer's events."""

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
        """The whole answer."""


class ChunkStream:
    """Builds the events of one streamed chat completion: constant id and
    created, strictly increasing event ids."""

    end_frame = DONE

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self.last_id = 0
        # Fields the finish chunk carries besides OpenAI's (llmmesh_citations, ...).
        self.final_fields: dict[str, object] = {}
        # A content chunk is the same JSON each time but for its text: framed
        # once here around a marker, each one then costs one string encoding.
        # The text is the chunk's last string, so its marker is the last one
        # even if the model's name held it too.
        marker = "\x00"
        choice = {"index": 0, "delta": {"content": marker}, "logprobs": None, "finish_reason": None}
        template = json.dumps(self._chunk([choice]), separators=(",", ":"))
        self._content_head, self._content_tail = template.rsplit(json.dumps(marker), 1)

    def _chunk(self, choices: list[dict[str, object]]) -> dict[str, object]:
        return stream_chunk("chat.completion.chunk", self, choices)

    def role(self) -> SseEvent:
        """The first chunk (id 0): the assistant role and empty content."""
        return self._event(
            0,
            self._chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            ),
        )

    def opening(self) -> SseEvent:
        return self.role()

    def _event(self, event_id: int, payload: dict[str, object]) -> SseEvent:
        self.last_id = event_id
        return SseEvent(event_id, sse_data(payload))

    def content(self, sequence: int, text: str) -> SseEvent:
        """A content chunk; its id is the delta's sequence number (kept
        above the previous id should a region ever repeat one)."""
        event_id = max(sequence, self.last_id + 1)
        self.last_id = event_id
        data = f"{self._content_head}{json.dumps(text)}{self._content_tail}"
        return SseEvent(event_id, f"data: {data}\n\n".encode())

    def delta(self, delta: chat_service_pb2.ChatDelta) -> SseEvent:
        """The chunk of one delta: a plain content chunk when it is only
        text, else one with its tool-call fragments (and its text, if any)
        and its tokens' log probabilities."""
        if not delta.tool_calls and not delta.logprobs:
            return self.content(delta.sequence, delta.text)
        body: dict[str, object] = {}
        if delta.text or not delta.tool_calls:
            body["content"] = delta.text
        if delta.tool_calls:
            body["tool_calls"] = [tool_call_fragment(part) for part in delta.tool_calls]
        choice = {
            "index": 0,
            "delta": body,
            "logprobs": logprobs_object(delta.logprobs) if delta.logprobs else None,
            "finish_reason": None,
        }
        return self._event(max(delta.sequence, self.last_id + 1), self._chunk([choice]))

    def finish(
        self,
        reason: common_pb2.FinishReason.ValueType,
        filtered_categories: Sequence[str] = (),
        usage: common_pb2.TokenUsage | None = None,
    ) -> SseEvent:
        """The last choice chunk: an empty delta and the finish reason, and
        the categories that blocked the reply when a filter did. A
        cancelled turn's carries ``usage`` (what was billed) unless the
        usage chunk follows."""
        choice: dict[str, object] = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": FINISH_REASONS.get(reason, "stop"),
        }
        add_filter_results(choice, filtered_categories)
        chunk = self._chunk([choice])
        chunk.update(self.final_fields)
        if reason == common_pb2.FINISH_REASON_CANCELLED and usage is not None and not self.include_usage:
            chunk["usage"] = usage_object(usage)
        return self._event(self.last_id + 1, chunk)

    def usage(self, usage: common_pb2.TokenUsage) -> SseEvent:
        """The final chunk of ``include_usage``: empty choices, the usage."""
        chunk = self._chunk([])
        chunk["usage"] = usage_object(usage)
        return self._event(self.last_id + 1, chunk)

    def error(self, body: dict[str, object]) -> SseEvent:
        """An error object as an event: the stream's last, never followed by ``[DONE]``."""
        return self._event(self.last_id + 1, body)


def completion_object(
    completion_id: str,
    created: int,
    model: str,
    reply: ReplyCollector,
    reason: common_pb2.FinishReason.ValueType,
    usage: common_pb2.TokenUsage,
    filtered_categories: Sequence[str] = (),
    *,
    logprobs: bool = False,
) -> dict[str, object]:
    """A whole ``chat.completion`` of the collected ``reply``: its message
    (tool calls included), its tokens' log probabilities when ``logprobs``
    was asked, and ``filtered_categories`` when a filter blocked the reply,
    as the streamed finish chunk names them."""
    choice: dict[str, object] = {
        "index": 0,
        "message": reply.message(),
        "logprobs": logprobs_object(reply.logprobs) if logprobs else None,
        "finish_reason": FINISH_REASONS.get(reason, "stop"),
    }
    add_filter_results(choice, filtered_categories)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage_object(usage),
    }


class ChatFormat:
    """A chat turn's answer: ``chat.completion.chunk`` events or one
    ``chat.completion`` (with its tokens' log probabilities when ``logprobs``)."""

    def __init__(self, *, logprobs: bool) -> None:
        self._logprobs = logprobs

    def frames(self, completion_id: str, created: int, model: str, include_usage: bool) -> ChunkStream:
        return ChunkStream(completion_id, created, model, include_usage)

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
        return completion_object(
            completion_id, created, model, reply, reason, usage, filtered_categories, logprobs=self._logprobs
        )
