"""OpenAI ``response`` objects, whole and streamed as typed events.

A whole response is ``{"id": "resp_...", "object": "response",
"created_at", "status", "model", "output": [...], "usage", "error",
"incomplete_details", ...}`` with the request's parameters echoed
(:class:`ResponseShape`). Output items are an assistant ``message`` with
one ``output_text`` part, then a ``function_call`` item per tool call
(``call_id``, ``name``, ``arguments``). Item ids derive from the response
id, so a stored response read back has the ids it was created with.

Status: ``completed`` (stop, tool calls), ``incomplete`` with
``incomplete_details.reason`` ``max_output_tokens`` (the output limit) or
``content_filter`` (the output filter blocked the reply), ``cancelled``
(the stream was cancelled) or ``failed`` (an error).

A stream's events are framed as OpenAI's, an ``event:`` line naming the
type before the ``data:`` line, each with its ``sequence_number`` (also its
event id for a resume): ``response.created``, ``response.in_progress``,
then per item ``response.output_item.added``, for a message
``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, for a call
``response.function_call_arguments.delta``...,
``response.function_call_arguments.done``, then
``response.output_item.done``; last ``response.completed`` (or
``response.incomplete``), carrying the whole response. An error mid-stream
ends it with ``response.failed`` and an ``error`` event. No ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmmesh.edge.chunks import SseEvent
from llmmesh.edge.reply_parts import ReplyCollector
from llmmesh.v1 import chat_service_pb2, common_pb2

JsonObject = dict[str, object]

_INCOMPLETE: dict[int, str] = {
    common_pb2.FINISH_REASON_LENGTH: "max_output_tokens",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
}


def status_of(reason: common_pb2.FinishReason.ValueType) -> tuple[str, JsonObject | None]:
    """A response's ``status`` and ``incomplete_details`` for a turn's finish reason."""
    if reason in _INCOMPLETE:
        return "incomplete", {"reason": _INCOMPLETE[reason]}
    if reason == common_pb2.FINISH_REASON_CANCELLED:
        return "cancelled", None
    if reason == common_pb2.FINISH_REASON_ERROR:
        return "failed", None
    return "completed", None


def usage_of(usage: common_pb2.TokenUsage) -> JsonObject:
    """A response's ``usage``."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def item_token(response_id: str) -> str:
    """What an output item's id carries of its response's id."""
    return response_id.removeprefix("resp_")


def message_item(response_id: str, text: str, status: str, index: int = 0) -> JsonObject:
    suffix = f"_{index}" if index else ""
    return {
        "id": f"msg_{item_token(response_id)}{suffix}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [text_part(text)],
    }


def text_part(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(response_id: str, index: int, call: common_pb2.ToolCall, status: str) -> JsonObject:
    return {
        "id": f"fc_{item_token(response_id)}_{index}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


def output_items(
    response_id: str, text: str, calls: Sequence[common_pb2.ToolCall], status: str
) -> list[JsonObject]:
    """A reply's output: its message (when it has text, or nothing else), then its calls."""
    item_status = "incomplete" if status == "incomplete" else "completed"
    items: list[JsonObject] = []
    if text or not calls:
        items.append(message_item(response_id, text, item_status))
    items.extend(call_item(response_id, i, c, item_status) for i, c in enumerate(calls))
    return items


@dataclass
class ResponseShape:
    """What a response object carries besides its output: the request's
    parameters as OpenAI echoes them."""

    echo: JsonObject = field(default_factory=dict)

    def response(
        self,
        response_id: str,
        created_at: int,
        model: str,
        *,
        status: str,
        output: list[JsonObject],
        usage: common_pb2.TokenUsage | None,
        incomplete: JsonObject | None = None,
        error: JsonObject | None = None,
    ) -> JsonObject:
        body: JsonObject = {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "model": model,
            "output": output,
            "usage": usage_of(usage) if usage is not None else None,
        }
        body.update(self.echo)
        return body


def _frame(kind: str, payload: JsonObject) -> bytes:
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


@dataclass
class _Call:
    output_index: int
    item: JsonObject
    arguments: list[str] = field(default_factory=list)


class ResponseEvents:
    """Builds one streamed response's events, numbered 0, 1, 2, ... (their
    ``sequence_number``)."""

    end_frame = b""
    include_usage = False

    def __init__(self, shape: ResponseShape, response_id: str, created: int, model: str) -> None:
        self.completion_id = response_id
        self.created = created
        self.model = model
        self.final_fields: JsonObject = {}
        self._shape = shape
        self._next = 0
        self._output: list[JsonObject] = []
        # The message item being written: its output index and text so far.
        self._message: tuple[int, list[str]] | None = None
        self._messages = 0
        self._calls: dict[int, _Call] = {}
        self._open_calls: list[_Call] = []

    def _event(self, kind: str, payload: JsonObject) -> SseEvent:
        sequence = self._next
        self._next += 1
        return SseEvent(sequence, _frame(kind, {"type": kind, "sequence_number": sequence, **payload}))

    def _response(self, status: str, **extra: object) -> JsonObject:
        return self._shape.response(
            self.completion_id,
            self.created,
            self.model,
            status=status,
            output=self._output,
            usage=None,
            **extra,  # type: ignore[arg-type]
        )

    def opening(self) -> list[SseEvent]:
        response = self._response("in_progress")
        return [
            self._event("response.created", {"response": response}),
            self._event("response.in_progress", {"response": response}),
        ]

    def delta(self, delta: chat_service_pb2.ChatDelta) -> list[SseEvent]:
        events: list[SseEvent] = []
        if delta.text:
            if self._message is None:
                events.extend(self._open_message())
            assert self._message is not None
            index, texts = self._message
            texts.append(delta.text)
            events.append(
                self._event(
                    "response.output_text.delta",
                    {
                        "item_id": self._output[index]["id"],
                        "output_index": index,
                        "content_index": 0,
                        "delta": delta.text,
                        "logprobs": [],
                    },
                )
            )
        for part in delta.tool_calls:
            call = self._calls.get(part.index)
            if call is None:
                events.extend(self._close_message("completed"))
                call = self._open_call(part, events)
            if part.arguments:
                call.arguments.append(part.arguments)
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        {
                            "item_id": call.item["id"],
                            "output_index": call.output_index,
                            "delta": part.arguments,
                        },
                    )
                )
        return events

    def _open_message(self) -> list[SseEvent]:
        index = len(self._output)
        item = message_item(self.completion_id, "", "in_progress", self._messages)
        self._messages += 1
        item["content"] = []
        self._output.append(item)
        self._message = (index, [])
        return [
            self._event("response.output_item.added", {"output_index": index, "item": dict(item)}),
            self._event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": text_part("")},
            ),
        ]

    def _close_message(self, status: str) -> list[SseEvent]:
        if self._message is None:
            return []
        index, texts = self._message
        self._message = None
        item = self._output[index]
        text = "".join(texts)
        part = text_part(text)
        item.update(status=status, content=[part])
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []}),
            self._event("response.content_part.done", {**where, "part": part}),
            self._event("response.output_item.done", {"output_index": index, "item": item}),
        ]

    def _open_call(self, part: common_pb2.ToolCallDelta, events: list[SseEvent]) -> _Call:
        index = len(self._output)
        call = common_pb2.ToolCall(id=part.id, name=part.name)
        item = call_item(self.completion_id, len(self._calls), call, "in_progress")
        self._output.append(item)
        opened = self._calls[part.index] = _Call(index, item)
        self._open_calls.append(opened)
        events.append(self._event("response.output_item.added", {"output_index": index, "item": dict(item)}))
        return opened

    def _close_calls(self, status: str) -> list[SseEvent]:
        events = []
        for call in self._open_calls:
            arguments = "".join(call.arguments)
            call.item.update(status=status, arguments=arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    {
                        "item_id": call.item["id"],
                        "output_index": call.output_index,
                        "name": call.item["name"],
                        "arguments": arguments,
                    },
                )
            )
            events.append(
                self._event(
                    "response.output_item.done", {"output_index": call.output_index, "item": call.item}
                )
            )
        self._open_calls = []
        return events

    def finish(
        self,
        reason: common_pb2.FinishReason.ValueType,
        filtered_categories: Sequence[str] = (),
        usage: common_pb2.TokenUsage | None = None,
    ) -> list[SseEvent]:
        status, incomplete = status_of(reason)
        item_status = "incomplete" if status == "incomplete" else "completed"
        events = [*self._close_message(item_status), *self._close_calls(item_status)]
        response = self._shape.response(
            self.completion_id,
            self.created,
            self.model,
            status=status,
            output=self._output,
            usage=usage,
            incomplete=incomplete,
        )
        response.update(self.final_fields)
        kind = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
            status, "response.completed"
        )
        events.append(self._event(kind, {"response": response}))
        return events

    def usage(self, usage: common_pb2.TokenUsage) -> SseEvent:
        raise AssertionError("a response carries its usage in its last event")

    def error(self, body: dict[str, object]) -> list[SseEvent]:
        """``response.failed`` with the error, then the ``error`` event itself."""
        error = body.get("error")
        detail = error if isinstance(error, dict) else {}
        failure = {"code": detail.get("code") or "server_error", "message": detail.get("message", "")}
        response = self._response("failed", error=failure)
        return [
            self._event("response.failed", {"response": response}),
            self._event(
                "error",
                {"code": detail.get("code"), "message": detail.get("message"), "param": detail.get("param")},
            ),
        ]


class ResponsesFormat:
    """A Responses turn's answer: :class:`ResponseEvents`, or one whole response."""

    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape

    def frames(self, completion_id: str, created: int, model: str, include_usage: bool) -> ResponseEvents:
        return ResponseEvents(self._shape, completion_id, created, model)

    def whole(
        self,
        completion_id: str,
        created: int,
        model: str,
        reply: ReplyCollector,
        reason: common_pb2.FinishReason.ValueType,
        usage: common_pb2.TokenUsage,
        filtered_categories: Sequence[str],
    ) -> JsonObject:
        status, incomplete = status_of(reason)
        output = output_items(completion_id, "".join(reply.text), reply.calls.calls(), status)
        return self._shape.response(
            completion_id, created, model, status=status, output=output, usage=usage, incomplete=incomplete
        )
