"""The trace collector of ``llmmesh bench overhead``'s traced mesh: an
OTLP/gRPC ``TraceService`` on loopback that takes every export, counts its
spans and drops them. The traced planes do all of tracing's own work
(spans, context in metadata and messages, batching, encoding, the export
call); only what a real collector does with the spans afterwards is left
out, which is not on the mesh's path. The count shows that the traced mesh
really traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from llmmesh.bench.routing_systems import HOST

# The planes' settings that turn tracing on and point it here.
ENDPOINT_ENV = "LLMMESH_OTLP_ENDPOINT"


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Counts the spans exported to it."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.exports += 1
        self.spans += sum(
            len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans
        )
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.asynccontextmanager
async def running_span_sink() -> AsyncIterator[tuple[str, SpanSink]]:
    """A :class:`SpanSink` served on loopback: its ``http://host:port`` endpoint and the sink."""
    sink = SpanSink()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    try:
        yield f"http://{HOST}:{port}", sink
    finally:
        await server.stop(0.5)
