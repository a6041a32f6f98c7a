"""gRPC plumbing every plane shares: a server with ``grpc.health.v1``,
reflection, graceful drain, mTLS and per-RPC authorization
(:mod:`llmmesh.core.access`), and channels with the mesh's options."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from llmmesh.core import tracing
from llmmesh.core.access import AccessPolicy, Caller, set_caller
from llmmesh.core.errors import InvalidArgument, MeshError, Reason
from llmmesh.core.grpc_tracing import client_interceptors, traced_stream, traced_unary
from llmmesh.core.mtls import MeshSecurity, open_secure_channel, peer_identity

log = logging.getLogger(__name__)

# Keepalive pings find a dead peer within seconds, so a broken token stream
# surfaces as UNAVAILABLE instead of hanging.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # The edge pings its regions every second to notice a cut link mid-stream
    # (edge.mesh_client); pings more often than this count as abuse.
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    # Channels ping while idle too; without this the server counts those
    # pings as abuse and ends idle channels with GOAWAY "too_many_pings".
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def open_channel(
    address: str, security: MeshSecurity | None = None, server_name: str = ""
) -> grpc.aio.Channel:
    """A channel to a mesh peer: mTLS with ``security``, expecting the server
    to answer to ``server_name`` (:func:`llmmesh.core.identity.role_name`), or
    plaintext when ``security`` is None or insecure."""
    if security is None or not security.enabled:
        return grpc.aio.insecure_channel(
            address, options=CHANNEL_OPTIONS, interceptors=client_interceptors() or None
        )
    if not server_name:
        raise ValueError("a secure channel needs the name its server answers to")
    return open_secure_channel(address, security, server_name, list(CHANNEL_OPTIONS))


class _Undecodable:
    """A request message that did not parse (invalid UTF-8 in a string
    field, truncated bytes), in place of the message."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error

    def invalid(self) -> InvalidArgument:
        return InvalidArgument(Reason.INVALID_REQUEST, f"the request message does not parse: {self.error}")


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def run(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as err:
            return _Undecodable(err)

    return run


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Undecodable):
            await request.invalid().abort(context)
        yield request


class _Gate:
    """The check every call passes before its handler runs: on a secured
    server, the caller's identity against the server's access policy."""

    def __init__(self, secured: bool, access: AccessPolicy | None) -> None:
        self._secured = secured
        self._access = access

    async def admit(self, method: str, context: grpc.aio.ServicerContext) -> None:
        if not self._secured:
            return
        caller = Caller(True, peer_identity(context))
        try:
            assert self._access is not None
            self._access.check(method, caller)
        except MeshError as err:
            log.warning("refused %s to %s: %s", method, caller.identity, err.message)
            await err.abort(context)
        set_caller(caller)


def _checking(handler: Any, method: str, gate: _Gate) -> Any:
    """``handler`` (an RpcMethodHandler) admitting only callers ``gate``
    lets in, and answering an undecodable request with INVALID_ARGUMENT and
    ErrorInfo, instead of the INTERNAL grpc gives when a deserializer raises."""
    kind = next(
        k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream") if getattr(handler, k)
    )
    inner = getattr(handler, kind)
    if kind.startswith("unary"):

        async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await gate.admit(method, context)
            if isinstance(request, _Undecodable):
                await request.invalid().abort(context)
            return request

        if inspect.isasyncgenfunction(inner):

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for response in inner(await check(request, context), context):
                    yield response

            behavior: Any = unary_stream
        else:

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await inner(await check(request, context), context)

            behavior = unary
    elif inspect.isasyncgenfunction(inner):

        async def stream_stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            await gate.admit(method, context)
            async for response in inner(_checked(requests, context), context):
                yield response

        behavior = stream_stream
    else:

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await gate.admit(method, context)
            return await inner(_checked(requests, context), context)

        behavior = stream_unary
    if tracing.enabled() and kind != "stream_stream":
        # Traced outermost, so a refused or undecodable call is in its span too.
        # Token streams carry their requests' trace context in their messages.
        behavior = (traced_stream if kind.endswith("stream") else traced_unary)(method, behavior)
    return handler._replace(request_deserializer=_lenient(handler.request_deserializer), **{kind: behavior})


class _DecodeCheckingServer:
    """What generated ``add_*Servicer_to_server`` functions register on:
    the real server, with every method handler made :func:`_checking`."""

    def __init__(self, server: grpc.aio.Server, gate: _Gate) -> None:
        self._server = server
        self._gate = gate

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        # Generated code registers each service both ways; the registered
        # method handlers (below) carry the same methods, already wrapped.
        del handlers

    def add_registered_method_handlers(self, service_name: str, method_handlers: Mapping[str, Any]) -> None:
        wrapped = {
            name: _checking(handler, f"/{service_name}/{name}", self._gate)
            for name, handler in method_handlers.items()
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, wrapped),))
        self._server.add_registered_method_handlers(service_name, wrapped)


class GrpcServer:
    """A ``grpc.aio`` server with health and reflection.

    ``register`` callbacks add servicers; ``service_names`` are the full names
    of the services they add, reported through health and reflection. With a
    secured ``security`` it serves mTLS only, and ``access`` says which
    identities may call which of the servicers' methods (health and
    reflection answer any holder of a mesh certificate).
    """

    def __init__(
        self,
        register: Callable[[grpc.aio.Server], None],
        service_names: Sequence[str],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        security: MeshSecurity | None = None,
        access: AccessPolicy | None = None,
    ) -> None:
        self._security = security or MeshSecurity.insecure()
        if self._security.enabled and access is None:
            raise ValueError("a secured server needs an access policy")
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        self._health = health.aio.HealthServicer()
        self._service_names = list(service_names)
        self._host = host
        self._port = port
        self._probe: grpc.aio.Server | None = None
        self.address = ""
        register(_DecodeCheckingServer(self._server, _Gate(self._security.enabled, access)))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            [*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )

    async def start(self) -> str:
        """Bind, start serving and return ``host:port``."""
        where = f"{self._host}:{self._port}"
        if self._security.enabled:
            bound = self._server.add_secure_port(where, self._security.server_credentials())
        else:
            bound = self._server.add_insecure_port(where)
        if bound == 0:
            raise OSError(f"cannot bind {self._host}:{self._port}")
        await self._server.start()
        if self._security.probe_port:
            try:
                self._probe = await self._start_probe(self._security.probe_port)
            except BaseException:
                await self._server.stop(None)
                raise
        self.address = f"{self._host}:{bound}"
        await self.set_serving(True)
        return self.address

    async def _start_probe(self, port: int) -> grpc.aio.Server:
        """grpc.health.v1 alone, plaintext, on ``port``: kubelet's gRPC probe
        speaks no TLS. It shares this server's health, so a drain shows there too."""
        probe = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, probe)
        if probe.add_insecure_port(f"{self._host}:{port}") == 0:
            raise OSError(f"cannot bind the probe port {self._host}:{port}")
        await probe.start()
        return probe

    async def set_serving(self, serving: bool) -> None:
        """Report every service (and the server as a whole) up or down."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self._service_names]:
            await self._health.set(name, status)

    async def set_ready(self, ready: bool) -> None:
        """Report the plane's services up or down, leaving the server-wide
        ``""`` status (liveness) as it is: a plane whose dependency is down
        is alive, only not ready (:mod:`llmmesh.core.readiness`). Ignored once draining."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._service_names:
            await self._health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain: refuse new calls, give running ones ``grace_s`` to end."""
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        if self._probe is not None:
            await self._probe.stop(None)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()
