"""W3C trace context in gRPC metadata between a real ``grpc.aio`` server
(:class:`~llmmesh.grpcserver.GrpcServer`) and a channel of
:func:`~llmmesh.grpcserver.open_channel`: a call made inside a trace has a
client span, the server continues it in a server span, and a stream's spans
cover the whole stream, ended when it ends or is cancelled; a call outside
any trace is not traced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llmmesh.core import tracing
from llmmesh.core.grpcserver import GrpcServer, open_channel

pytestmark = pytest.mark.asyncio


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what


SERVICE = "tests.Echo"
UNARY = f"/{SERVICE}/Echo"
STREAM = f"/{SERVICE}/Count"
BIDI = f"/{SERVICE}/Session"


class Echo:
    """Answers a unary call with its request; streams ``count`` numbers,
    then waits to be cancelled when ``endless``."""

    def __init__(self) -> None:
        self.stream_ended = asyncio.Event()

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def session(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def count(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            for n in range(3):
                yield str(n).encode()
            if request == b"endless":
                await asyncio.Event().wait()
        finally:
            self.stream_ended.set()


@pytest_asyncio.fixture
async def echo(spans: InMemorySpanExporter) -> AsyncIterator[tuple[Echo, grpc.aio.Channel]]:
    servicer = Echo()

    def register(server: grpc.aio.Server) -> None:
        server.add_registered_method_handlers(
            SERVICE,
            {
                "Echo": grpc.unary_unary_rpc_method_handler(servicer.echo),
                "Count": grpc.unary_stream_rpc_method_handler(servicer.count),
                "Session": grpc.stream_stream_rpc_method_handler(servicer.session),
            },
        )

    server = GrpcServer(register, [SERVICE])
    address = await server.start()
    channel = open_channel(address)
    try:
        yield servicer, channel
    finally:
        await channel.close()
        await server.stop(0)


def named(found: tuple[ReadableSpan, ...], name: str, kind: SpanKind) -> ReadableSpan:
    [span] = [s for s in found if s.name == name and s.kind is kind]
    return span


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None
    return span.parent.span_id


async def test_a_call_inside_a_trace_is_continued_by_the_server(
    echo: tuple[Echo, grpc.aio.Channel], spans: InMemorySpanExporter
) -> None:
    _, channel = echo
    with tracing.span("caller") as caller:
        assert await channel.unary_unary(UNARY)(b"hello") == b"hello"
    await wait_until(lambda: len(spans.get_finished_spans()) == 3, 5.0, "three spans ended")
    found = spans.get_finished_spans()
    client = named(found, "tests.Echo/Echo", SpanKind.CLIENT)
    server = named(found, "tests.Echo/Echo", SpanKind.SERVER)
    assert parent_of(client) == caller.get_span_context().span_id
    assert client.context is not None and parent_of(server) == client.context.span_id
    assert server.context is not None and server.context.trace_id == caller.get_span_context().trace_id
    for span in (client, server):
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "grpc" and span.attributes["rpc.method"] == "Echo"
        assert span.attributes["rpc.grpc.status_code"] == 0


async def test_a_call_outside_any_trace_is_not_traced(
    echo: tuple[Echo, grpc.aio.Channel], spans: InMemorySpanExporter
) -> None:
    _, channel = echo
    assert await channel.unary_unary(UNARY)(b"background") == b"background"
    assert [n async for n in channel.unary_stream(STREAM)(b"")] == [b"0", b"1", b"2"]
    assert spans.get_finished_spans() == ()


async def test_a_streams_spans_cover_it_to_its_end(
    echo: tuple[Echo, grpc.aio.Channel], spans: InMemorySpanExporter
) -> None:
    _, channel = echo
    with tracing.span("caller"):
        call = channel.unary_stream(STREAM)(b"")
        received = [n async for n in call]
    assert received == [b"0", b"1", b"2"]
    await wait_until(lambda: len(spans.get_finished_spans()) == 3, 5.0, "three spans ended")
    server = named(spans.get_finished_spans(), "tests.Echo/Count", SpanKind.SERVER)
    client = named(spans.get_finished_spans(), "tests.Echo/Count", SpanKind.CLIENT)
    assert server.status.status_code is not StatusCode.ERROR
    assert client.end_time is not None and server.end_time is not None


async def test_a_cancelled_streams_spans_end_cancelled(
    echo: tuple[Echo, grpc.aio.Channel], spans: InMemorySpanExporter
) -> None:
    servicer, channel = echo
    with tracing.span("caller"):
        call = channel.unary_stream(STREAM)(b"endless")
        for _ in range(3):
            await call.read()
        # The stream runs on: neither side's span has ended.
        assert not [s for s in spans.get_finished_spans() if s.name == "tests.Echo/Count"]
        call.cancel()
    await asyncio.wait_for(servicer.stream_ended.wait(), 5.0)
    await wait_until(lambda: len(spans.get_finished_spans()) == 3, 5.0, "three spans ended")
    client = named(spans.get_finished_spans(), "tests.Echo/Count", SpanKind.CLIENT)
    server = named(spans.get_finished_spans(), "tests.Echo/Count", SpanKind.SERVER)
    assert client.attributes is not None
    assert client.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert client.status.status_code is StatusCode.ERROR
    assert server.end_time is not None


async def test_token_streams_are_left_to_their_messages_trace_context(
    echo: tuple[Echo, grpc.aio.Channel], spans: InMemorySpanExporter
) -> None:
    _, channel = echo
    with tracing.span("caller"):
        call = channel.stream_stream(BIDI)()
        await call.write(b"start")
        assert await call.read() == b"start"
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    # A bidirectional stream carries many requests: no span for the call itself.
    assert [s.name for s in spans.get_finished_spans()] == ["caller"]
