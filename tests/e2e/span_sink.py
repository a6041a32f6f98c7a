"""A trace collector for the end-to-end mesh: an OTLP/gRPC ``TraceService``
on loopback that keeps every span exported to it, and a reader of what a
kept span says (its text, its resource's plane and zone).

Served by a thread pool, not on an event loop: the tests that read it are
synchronous, and a pytest-asyncio test may run its own loop meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from llmmesh.core.tracing import REGION_ATTRIBUTE, ZONE_ATTRIBUTE


@dataclass(frozen=True)
class ExportedSpan:
    """One span as a collector received it, with its resource's attributes."""

    resource: dict[str, str]
    span: trace_pb2.Span

    @property
    def service(self) -> str:
        return self.resource.get("service.name", "")

    @property
    def zone(self) -> str:
        """The zone of the plane that made it; empty for the zone-agnostic and global planes."""
        return self.resource.get(ZONE_ATTRIBUTE, "")

    @property
    def region(self) -> str:
        return self.resource.get(REGION_ATTRIBUTE, "")

    def attribute(self, key: str) -> str | None:
        for pair in self.span.attributes:
            if pair.key == key:
                return text_of(pair.value)
        return None

    def texts(self) -> list[str]:
        """Everything it says: name, status, attributes, events and links (their
        names and attributes), and its resource's attributes, as ``key=value``."""
        said = [self.span.name, self.span.status.message]
        said += [f"{key}={value}" for key, value in self.resource.items()]
        said += [f"{pair.key}={text_of(pair.value)}" for pair in self.span.attributes]
        for event in self.span.events:
            said.append(event.name)
            said += [f"{pair.key}={text_of(pair.value)}" for pair in event.attributes]
        for link in self.span.links:
            said += [f"{pair.key}={text_of(pair.value)}" for pair in link.attributes]
        return said


def text_of(value: common_pb2.AnyValue) -> str:
    """An attribute value as text (arrays and maps joined, bytes as latin-1)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return ",".join(text_of(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return ",".join(f"{pair.key}={text_of(pair.value)}" for pair in value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.decode("latin-1")
    return "" if kind is None else str(getattr(value, kind))


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it; ``endpoint`` is where it is served."""

    def __init__(self) -> None:
        self.endpoint = ""
        self._lock = threading.Lock()
        self._spans: list[ExportedSpan] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = [
            ExportedSpan({pair.key: text_of(pair.value) for pair in resource.resource.attributes}, span)
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self._spans += received
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[ExportedSpan]:
        """The spans received so far."""
        with self._lock:
            return list(self._spans)


@contextmanager
def serving_span_sink() -> Iterator[SpanSink]:
    """A :class:`SpanSink` served on loopback, at its ``endpoint`` (``http://host:port``)."""
    sink = SpanSink()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sink.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield sink
    finally:
        server.stop(0).wait()
