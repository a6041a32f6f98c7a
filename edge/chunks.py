"""OpenAI ``chat.completion.chunk`` and ``chat.completion`` objects, and
their SSE framing.

Every SSE event of a stream carries ``id: N``, its position, so a client can
resume after it: the role chunk is 0, a content chunk has its delta's
sequence number, then come the finish chunk and, with ``include_usage``, the
usage chunk. ``data: [DONE]`` has no id: it is the end marker, not an event.

A reply the region's output filter blocked ends as OpenAI ends one: a finish
chunk with ``finish_reason: "content_filter"``, then ``[DONE]``; a whole
``chat.completion`` has that finish reason on its choice. Either choice also
names the flagged categories as Azure OpenAI does,
``"content_filter_results": {"violence": {"filtered": true}}``, a field the
OpenAI SDKs keep as an extra without failing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from llmmesh.v1 import chat_service_pb2, common_pb2

DONE = b"data: [DONE]\n\n"

FINISH_REASONS: dict[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    # OpenAI has no "cancelled"; a stopped generation reads as a stop.
    common_pb2.FINISH_REASON_CANCELLED: "stop",
    common_pb2.FINISH_REASON_ERROR: "stop",
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


def _add_filter_results(choice: dict[str, object], categories: Sequence[str]) -> None:
    if categories:
        choice["content_filter_results"] = {c: {"filtered": True} for c in categories}


def sse_event(event_id: int, payload: dict[str, object]) -> bytes:
    return f"id: {event_id}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def sse_data(payload: dict[str, object]) -> bytes:
    """An event without ``id:``: a client's Last-Event-ID stays where it was."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class SseEvent(NamedTuple):
    """One framed SSE event and its id."""

    event_id: int
    frame: bytes


class ChunkStream:
    """Builds the events of one streamed completion: constant id and created,
    strictly increasing event ids."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self.last_id = 0
        # A content chunk is the same JSON each time but for its text: framed
        # once here around a marker, each one then costs one string encoding.
        # The text is the chunk's last string, so its marker is the last one
        # even if the model's name held it too.
        marker = "\x00"
        choice = {"index": 0, "delta": {"content": marker}, "logprobs": None, "finish_reason": None}
        template = json.dumps(self._chunk([choice]), separators=(",", ":"))
        self._content_head, self._content_tail = template.rsplit(json.dumps(marker), 1)

    def _chunk(self, choices: list[dict[str, object]]) -> dict[str, object]:
        chunk: dict[str, object] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

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

    def _event(self, event_id: int, payload: dict[str, object]) -> SseEvent:
        self.last_id = event_id
        return SseEvent(event_id, sse_event(event_id, payload))

    def content(self, sequence: int, text: str) -> SseEvent:
        """A content chunk; its id is the delta's sequence number (kept
        above the previous id should a region ever repeat one)."""
        event_id = max(sequence, self.last_id + 1)
        self.last_id = event_id
        data = f"{self._content_head}{json.dumps(text)}{self._content_tail}"
        return SseEvent(event_id, f"id: {event_id}\ndata: {data}\n\n".encode())

    def finish(
        self, reason: common_pb2.FinishReason.ValueType, filtered_categories: Sequence[str] = ()
    ) -> SseEvent:
        """The last choice chunk: an empty delta and the finish reason, and
        the categories that blocked the reply when a filter did."""
        choice: dict[str, object] = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": FINISH_REASONS.get(reason, "stop"),
        }
        _add_filter_results(choice, filtered_categories)
        return self._event(self.last_id + 1, self._chunk([choice]))

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
    text: str,
    reason: common_pb2.FinishReason.ValueType,
    usage: common_pb2.TokenUsage,
    filtered_categories: Sequence[str] = (),
) -> dict[str, object]:
    """A whole ``chat.completion``; its choice names ``filtered_categories``
    when a filter blocked the reply, as the streamed finish chunk does."""
    choice: dict[str, object] = {
        "index": 0,
        "message": {"role": "assistant", "content": text, "refusal": None},
        "logprobs": None,
        "finish_reason": FINISH_REASONS.get(reason, "stop"),
    }
    _add_filter_results(choice, filtered_categories)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage_object(usage),
    }
