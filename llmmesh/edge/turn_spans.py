"""The edge's spans of one chat turn: one per region that serves a part of
it, each the parent of that region's turn span (its trace context rides in
the turn's start on the region's session stream).

The first region's span is a child of the HTTP request's. When the turn
fails over (:mod:`edge.failover`), the failed region's span ends as failed
and the next region's span starts in the same trace, beside it, with a
link to the first span: the turn it continues. The span current at the end
carries the turn's GenAI attributes (usage, finish reasons), since the
last region reports the whole turn's usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind

from llmmesh.core import tracing
from llmmesh.core.genai_spans import chat_attributes, record_finish, record_usage
from llmmesh.v1 import chat_service_pb2, common_pb2


class TurnSpans:
    """The spans of turn ``stream_id`` on ``model`` (see the module docstring)."""

    def __init__(self, model: str, stream_id: str) -> None:
        # Empty while the region is still to choose the model ("auto").
        self._model = model or "auto"
        self._stream_id = stream_id
        self._parent = otel_context.get_current()
        self._attempt = 1
        self.span = self._start()
        self._first = self.span
        self._ended = False

    def _start(self) -> Span:
        attributes = chat_attributes(self._model, plane="edge", request_id=self._stream_id, attempt=1)
        return tracing.start_span(
            f"chat {self._model}", kind=SpanKind.CLIENT, parent=self._parent, attributes=attributes
        )

    @contextmanager
    def current(self) -> Iterator[None]:
        """The serving region's span current for the block (a start sent in
        it carries the span's trace context)."""
        with tracing.current(self.span):
            yield

    def opened(self, started: chat_service_pb2.ChatStarted) -> None:
        """The region accepted the turn."""
        if self.span.is_recording():
            self.span.set_attribute("llmmesh.region", started.region)
            self.span.set_attribute("gen_ai.response.id", started.request_id)
            self.span.set_attribute("gen_ai.response.model", started.model)

    def failed_over(self, region: str, why: str) -> None:
        """``region``'s part ended broken: its span ends failed, and the
        next region's starts, linked to the turn's first span."""
        if self._ended:
            return
        tracing.end_failed(self.span, f"region {region} lost: {why}")
        self._attempt += 1
        self.span = tracing.start_span(
            f"chat {self._model}",
            kind=SpanKind.CLIENT,
            parent=self._parent,
            links=[tracing.link_to(self._first, **{"llmmesh.link": "failover_of"})],
            attributes=chat_attributes(
                self._model,
                plane="edge",
                request_id=self._stream_id,
                attempt=self._attempt,
                failover_from_region=region,
            ),
        )

    def finish(self, usage: common_pb2.TokenUsage, reason: common_pb2.FinishReason.ValueType) -> None:
        """The turn ended with ``reason``; ``usage`` is the whole turn's."""
        if self._ended:
            return
        self._ended = True
        if self.span.is_recording():
            record_usage(self.span, usage)
            record_finish(self.span, reason)
        self.span.end()

    def fail(self, error: BaseException | str) -> None:
        """The turn ended with ``error`` (or was abandoned)."""
        if self._ended:
            return
        self._ended = True
        tracing.end_failed(self.span, error)
