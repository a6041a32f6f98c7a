"""OpenAI ``chat.completion.chunk`` and ``chat.completion`` objects, and
their SSE framing. Every SSE event carries an ``id:`` so a client can resume."""

from __future__ import annotations

import json

from llmmesh.v1 import common_pb2

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


def sse_event(event_id: int, payload: dict[str, object]) -> bytes:
    return f"id: {event_id}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class ChunkStream:
    """Builds the chunks of one streamed completion (constant id and created)."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self.last_id = 0

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

    def role(self) -> bytes:
        """The first chunk: the assistant role and empty content."""
        return sse_event(
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

    def content(self, sequence: int, text: str) -> bytes:
        self.last_id = max(self.last_id, sequence)
        return sse_event(
            sequence,
            self._chunk([{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]),
        )

    def finish(self, reason: common_pb2.FinishReason.ValueType) -> bytes:
        self.last_id += 1
        return sse_event(
            self.last_id,
            self._chunk(
                [
                    {
                        "index": 0,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": FINISH_REASONS.get(reason, "stop"),
                    }
                ]
            ),
        )

    def usage(self, usage: common_pb2.TokenUsage) -> bytes:
        """The final chunk of ``include_usage``: empty choices, the usage."""
        self.last_id += 1
        chunk = self._chunk([])
        chunk["usage"] = usage_object(usage)
        return sse_event(self.last_id, chunk)

    def error(self, body: dict[str, object]) -> bytes:
        self.last_id += 1
        return sse_event(self.last_id, body)


def completion_object(
    completion_id: str,
    created: int,
    model: str,
    text: str,
    reason: common_pb2.FinishReason.ValueType,
    usage: common_pb2.TokenUsage,
) -> dict[str, object]:
    """A whole ``chat.completion``."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": FINISH_REASONS.get(reason, "stop"),
            }
        ],
        "usage": usage_object(usage),
    }
