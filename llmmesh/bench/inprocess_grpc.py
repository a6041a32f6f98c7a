"""gRPC without sockets: a generated stub calls a servicer in the same
event loop, with each message serialized and parsed as on the wire.

:class:`InProcessServer` takes servicers through their generated
``add_*Servicer_to_server`` functions; :meth:`InProcessServer.channel` is a
``grpc.aio.Channel`` stand-in for the generated stubs (unary and streaming
calls, ``write``/``done_writing``/``cancel``, deadlines by ``timeout``).
A servicer's ``context.abort`` reaches the caller as the
``grpc.aio.AioRpcError`` a real channel raises, trailing metadata (the rich
error status) included; an exception it lets escape is ``UNKNOWN``;
cancelling the call cancels the servicer's task, as a client going away
does. Each streaming call runs its handler in its own task, as a server
does, so the two sides interleave through queues.

Not modelled: connection set-up, flow control and message size limits,
interceptors, compression, call credentials, peer identity. Deadlines and
every wait follow the running loop's clock, so on a
:mod:`llmmesh.bench.virtual_clock` loop a call takes no time at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]
_END = object()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, Any]]) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = tuple(trailing)


def _rpc_error(
    code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


def _as_rpc_error(error: BaseException) -> grpc.aio.AioRpcError:
    if isinstance(error, _Aborted):
        return _rpc_error(error.code, error.details, error.trailing)
    if isinstance(error, grpc.aio.AioRpcError):
        return error
    return _rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}: {error}")


class _Context:
    """The part of ``grpc.aio.ServicerContext`` servicers use."""

    def __init__(self, metadata: Sequence[tuple[str, Any]] | None) -> None:
        self._metadata = tuple(metadata or ())
        self._code: grpc.StatusCode | None = None
        self._details = ""

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, Any]] = ()
    ) -> None:
        raise _Aborted(code, details, trailing_metadata)

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def peer(self) -> str:
        return "inprocess:"

    def done(self) -> bool:
        return False


class _Method:
    """One registered handler and the codecs of both ends."""

    def __init__(
        self,
        server: InProcessServer,
        path: str,
        request_serializer: Serializer,
        response_deserializer: Deserializer,
    ) -> None:
        self._server = server
        self._path = path
        self._request_serializer = request_serializer
        self._response_deserializer = response_deserializer

    @property
    def handler(self) -> grpc.RpcMethodHandler:
        return self._server.handler(self._path)

    def request(self, message: Any) -> Any:
        return self.handler.request_deserializer(self._request_serializer(message))

    def response(self, message: Any) -> Any:
        return self._response_deserializer(self.handler.response_serializer(message))


class _UnaryUnary:
    def __init__(self, method: _Method) -> None:
        self._method = method

    def __call__(
        self, request: Any, *, timeout: float | None = None, metadata: Any = None, **_: Any
    ) -> _UnaryCall:
        return _UnaryCall(self._method, request, timeout, metadata)


class _UnaryCall:
    def __init__(self, method: _Method, request: Any, timeout: float | None, metadata: Any) -> None:
        self._method, self._request, self._timeout, self._metadata = method, request, timeout, metadata

    def __await__(self) -> Generator[Any, None, Any]:
        return self._run().__await__()

    async def _run(self) -> Any:
        behaviour = self._method.handler.unary_unary
        try:
            async with asyncio.timeout(self._timeout):
                response = await behaviour(self._method.request(self._request), _Context(self._metadata))
        except TimeoutError:
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise _as_rpc_error(error) from None
        return self._method.response(response)


class _StreamCall:
    """A call whose responses stream back (unary-stream or stream-stream):
    the handler runs in its own task; responses and its end go through a queue."""

    def __init__(
        self, method: _Method, requests: AsyncIterator[Any] | Any, timeout: float | None, metadata: Any
    ) -> None:
        self._method = method
        self._responses: asyncio.Queue[Any] = asyncio.Queue()
        self._incoming: asyncio.Queue[Any] = asyncio.Queue()
        self._cancelled = False
        self._timeout = timeout
        self._task = asyncio.get_running_loop().create_task(self._serve(requests, _Context(metadata)))

    async def _serve(self, requests: Any, context: _Context) -> None:
        handler = self._method.handler
        outcome: object = _END
        try:
            async with asyncio.timeout(self._timeout):
                if handler.request_streaming:
                    stream = handler.stream_stream(self._requests(), context)
                else:
                    stream = handler.unary_stream(self._method.request(requests), context)
                async with contextlib.aclosing(stream):
                    async for response in stream:
                        self._responses.put_nowait(self._method.response(response))
        except TimeoutError:
            outcome = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            outcome = _rpc_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
            raise
        except Exception as error:
            outcome = _as_rpc_error(error)
        finally:
            self._responses.put_nowait(outcome)

    async def _requests(self) -> AsyncIterator[Any]:
        while (message := await self._incoming.get()) is not _END:
            yield self._method.request(message)

    async def write(self, request: Any) -> None:
        if self._cancelled or self._task.done():
            raise grpc.aio.UsageError("the call has ended")
        self._incoming.put_nowait(request)

    async def done_writing(self) -> None:
        self._incoming.put_nowait(_END)

    async def read(self) -> Any:
        """The next response, or ``grpc.aio.EOF`` after the last."""
        item = await self._responses.get()
        if item is _END:
            self._responses.put_nowait(_END)
            return grpc.aio.EOF
        if isinstance(item, grpc.aio.AioRpcError):
            self._responses.put_nowait(item)
            raise item
        return item

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (response := await self.read()) is not grpc.aio.EOF:
            yield response

    def cancel(self) -> bool:
        if self._task.done():
            return False
        self._cancelled = True
        self._task.cancel()
        return True

    def done(self) -> bool:
        return self._task.done()


class _UnaryStream:
    def __init__(self, method: _Method) -> None:
        self._method = method

    def __call__(
        self, request: Any, *, timeout: float | None = None, metadata: Any = None, **_: Any
    ) -> _StreamCall:
        return _StreamCall(self._method, request, timeout, metadata)


class _StreamStream:
    def __init__(self, method: _Method) -> None:
        self._method = method

    def __call__(self, *, timeout: float | None = None, metadata: Any = None, **_: Any) -> _StreamCall:
        return _StreamCall(self._method, None, timeout, metadata)


class InProcessChannel:
    """The channel the generated stubs take; see the module docstring."""

    def __init__(self, server: InProcessServer) -> None:
        self._server = server

    def _method(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer
    ) -> _Method:
        return _Method(self._server, path, request_serializer, response_deserializer)

    def unary_unary(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer, **_: Any
    ) -> _UnaryUnary:
        return _UnaryUnary(self._method(path, request_serializer, response_deserializer))

    def unary_stream(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer, **_: Any
    ) -> _UnaryStream:
        return _UnaryStream(self._method(path, request_serializer, response_deserializer))

    def stream_stream(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer, **_: Any
    ) -> _StreamStream:
        return _StreamStream(self._method(path, request_serializer, response_deserializer))

    async def close(self, grace: float | None = None) -> None:
        """Nothing to release: calls end with their tasks."""


class InProcessServer:
    """The handlers of the servicers added to it, by method path
    (``/package.Service/Method``)."""

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        """The generated functions add both; the registered ones suffice."""

    def handler(self, path: str) -> grpc.RpcMethodHandler:
        """The handler of ``path``; UNIMPLEMENTED (as a ``grpc.aio.AioRpcError``)
        when no servicer here has it."""
        try:
            return self._handlers[path]
        except KeyError:
            raise _rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}") from None

    def channel(self) -> InProcessChannel:
        return InProcessChannel(self)
