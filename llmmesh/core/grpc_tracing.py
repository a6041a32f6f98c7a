"""W3C trace context in gRPC call metadata: a client interceptor that
sends the current span's ``traceparent`` with every call made inside a
trace (under a client span covering the whole call, streams included),
and the server side, which continues it in a server span covering the
handler until its response (or stream) ends or is cancelled.

Only calls made inside a trace are traced: the planes' background calls
(heartbeats, policy snapshots, KV events) start no trace of their own. A
call made while tracing is off gets no interceptor at all
(:func:`client_interceptors` is empty), so it costs nothing.

Bidirectional streams are left alone: they are the token streams
(``ChatSession``, ``GenerateSession``, ``Chat``, ``Generate``), long-lived
and carrying many requests, whose trace context rides in each request's
start message instead (:func:`llmmesh.core.tracing.trace_context_message`). An
interceptor on them would wrap every token message, and a span of the
call would last as long as the session, not a turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from llmmesh.core import tracing


async def _status_of(call: Any) -> tuple[grpc.StatusCode | None, str | None]:
    try:
        return await call.code(), await call.details()
    except (asyncio.CancelledError, grpc.aio.AioRpcError):
        return None, None


def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


def rpc_attributes(method: str) -> dict[str, str]:
    """OpenTelemetry's RPC attributes of a full method name (``/pkg.Service/Method``)."""
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _end_with_status(span: Span, code: grpc.StatusCode | None, details: str | None) -> None:
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details or ''}"))
    span.end()


class _ClientTracing:
    """Every call inside a trace gets a client span and its ``traceparent``."""

    async def _call(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        if not trace.get_current_span().get_span_context().is_valid:
            return await continuation(details, request)
        method = _method_name(details.method)
        span = tracing.start_span(method.lstrip("/"), kind=SpanKind.CLIENT, attributes=rpc_attributes(method))
        headers: dict[str, str] = {}
        tracing.inject_headers(headers, trace.set_span_in_context(span))
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *headers.items())
        try:
            call = await continuation(details._replace(metadata=metadata), request)
        except BaseException as err:
            tracing.end_failed(span, err)
            raise

        def done(finished: Any) -> None:
            # A done call's status is known, but grpc.aio answers it only to an await.
            settling = asyncio.get_running_loop().create_task(_status_of(finished))
            settling.add_done_callback(lambda task: _end_with_status(span, *task.result()))

        call.add_done_callback(done)
        return call


# A channel files each interceptor under the first kind of call it serves,
# so each kind needs an interceptor of its own.
class _UnaryUnaryTracing(_ClientTracing, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._call(continuation, details, request)


class _UnaryStreamTracing(_ClientTracing, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._call(continuation, details, request)


class _StreamUnaryTracing(_ClientTracing, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await self._call(continuation, details, requests)


def client_interceptors() -> list[Any]:
    """The interceptors a channel made now gets: the tracing one when this
    process traces, none otherwise."""
    if not tracing.enabled():
        return []
    return [_UnaryUnaryTracing(), _UnaryStreamTracing(), _StreamUnaryTracing()]


def _remote_parent(context: grpc.aio.ServicerContext) -> Any:
    metadata = context.invocation_metadata() or ()
    headers = {key: value for key, value in metadata if key in ("traceparent", "tracestate")}
    return tracing.extract_headers(headers) if headers else None


def caller_trace(context: grpc.aio.ServicerContext) -> otel_context.Context:
    """The span a call's metadata names as its caller's (a handler that
    traces a call of its own, such as a bidirectional stream's one turn);
    an empty context, a trace of its own, when it names none."""
    return _remote_parent(context) or otel_context.Context()


def _server_span(method: str, context: grpc.aio.ServicerContext) -> Span | None:
    if not tracing.enabled():
        return None
    parent = _remote_parent(context)
    if parent is None:
        return None
    return tracing.start_span(
        method.lstrip("/"), kind=SpanKind.SERVER, parent=parent, attributes=rpc_attributes(method)
    )


def _finish(span: Span, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
    code = context.code() if hasattr(context, "code") else None
    if error is not None and code in (None, grpc.StatusCode.OK):
        tracing.end_failed(span, error)
        return
    _end_with_status(span, code or grpc.StatusCode.OK, context.details() if code else None)


def traced_unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    """``behavior`` (a unary-response handler) in a server span when the
    caller sent a trace context."""

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        span = _server_span(method, context)
        if span is None:
            return await behavior(request, context)
        error: BaseException | None = None
        try:
            with tracing.current(span):
                return await behavior(request, context)
        except BaseException as err:
            error = err
            raise
        finally:
            _finish(span, context, error)

    return run


def traced_stream(method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    """``behavior`` (a server-streaming handler) in a server span that
    ends when the stream ends or is cancelled."""

    async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        span = _server_span(method, context)
        if span is None:
            async for response in behavior(request, context):
                yield response
            return
        error: BaseException | None = None
        try:
            with tracing.current(span):
                async for response in behavior(request, context):
                    yield response
        except BaseException as err:
            error = err
            raise
        finally:
            _finish(span, context, error)

    return run
