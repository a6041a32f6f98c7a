"""A region's span of one turn: a child of the span its caller sent (the
edge's, on a session stream in the turn's start message; a gRPC client's,
in the ``Chat`` call's metadata), or the root of a trace of its own. It
carries the turn's GenAI attributes, read off the events the turn streams,
and is remembered by the turn's request id, so that the usage shipment
billing the turn links to it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from llmmesh.core import tracing
from llmmesh.core.genai_spans import ChatSpan, chat_attributes
from llmmesh.v1 import chat_service_pb2


@contextmanager
def turn_span(
    start: chat_service_pb2.ChatStart, request_id: str, parent: otel_context.Context | None
) -> Iterator[ChatSpan]:
    """The turn's span, current for the block (and the tasks it starts)."""
    attributes = chat_attributes(start.model, plane="region", request_id=request_id)
    with tracing.span(
        f"chat {start.model}", kind=SpanKind.SERVER, parent=parent, attributes=attributes
    ) as span:
        tracing.remember(request_id, span)
        yield ChatSpan(span)
