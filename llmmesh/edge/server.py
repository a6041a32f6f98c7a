"""Starting and stopping one edge: uvicorn on a socket bound up front, so
port 0 works and the bound URL is known before serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from llmmesh.core import lifecycle
from llmmesh.core.addresses import advertised_address, check_advertisable, join_host_port, split_host_port
from llmmesh.core.certs import CertFiles
from llmmesh.core.identity import Role
from llmmesh.core.mtls import MeshSecurity, TlsSetupError
from llmmesh.edge.app import RequestCounter, build_app
from llmmesh.edge.http_protocol import http_protocol
from llmmesh.edge.mesh_client import MeshClient, RouteOptions
from llmmesh.edge.request_id import RequestIdMiddleware
from llmmesh.edge.settings import EdgeSettings

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the process owner drains it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class EdgeServer:
    """A running edge."""

    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]

    async def stop(self) -> None:
        """Stop accepting, let open streams finish for a few seconds, close."""
        self.server.should_exit = True
        try:
            async with asyncio.timeout(10):
                await self.task
        except TimeoutError:
            self.server.force_exit = True
            await self.task


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket for the HTTP server.

    Its protocol is named (IPPROTO_TCP, not 0) because asyncio turns Nagle's
    algorithm off (TCP_NODELAY) only on accepted sockets that say they are
    TCP. With Nagle on, an SSE chunk waits for the client's delayed ACK of
    the chunk before it, up to 40 ms on Linux.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def ops_admin_security(settings: EdgeSettings, security: MeshSecurity) -> MeshSecurity | None:
    """The admin identity the operator API manages API keys with, when the
    operator gave the edge one (``ops_admin_cert_file``), checked against the
    mesh CA of the edge's own certificate; TlsSetupError unless it is an admin
    identity."""
    if not settings.ops_admin_cert_file:
        return None
    assert security.files is not None
    files = CertFiles(
        Path(settings.ops_admin_cert_file), Path(settings.ops_admin_key_file), security.files.ca
    )
    admin = MeshSecurity.mtls(files)
    if admin.identity is None or admin.identity.role is not Role.ADMIN:
        raise TlsSetupError(
            f"ops_admin_cert_file {files.cert} names {admin.identity}, not an admin identity: "
            "issue one with `llmmesh certs issue admin` (`llmmesh up` keeps one as certs/admin.pem)"
        )
    return admin


async def start_edge(settings: EdgeSettings) -> EdgeServer:
    """Start an edge in this process and return it serving."""
    check_advertisable(settings.host, settings.advertise_address, "the edge")
    split_host_port(settings.global_address, "global_address")
    security = settings.mesh_security("edge")
    security.expect_role(Role.EDGE)
    admin = ops_admin_security(settings, security)
    sock = listening_socket(settings.host, settings.port)
    port = sock.getsockname()[1]
    mesh = MeshClient(
        settings.global_address,
        auth_cache_s=settings.auth_cache_ms / 1000,
        region_keepalive_ms=settings.region_keepalive_ms,
        routes=RouteOptions(
            settings.route_cache_ms / 1000, settings.route_stale_ms / 1000, settings.location
        ),
        outage_grace_s=settings.global_outage_grace_s,
        security=security,
        admin_security=admin,
    )
    app = RequestCounter(RequestIdMiddleware(build_app(settings, mesh)))
    config = uvicorn.Config(
        app,
        http=http_protocol(settings.header_timeout_s),
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
        access_log=False,
        ssl_certfile=settings.https_cert_file or None,
        ssl_keyfile=settings.https_key_file or None,
    )
    try:
        # Loaded here, so that a missing or unreadable certificate fails the start.
        config.load()
    except BaseException:
        sock.close()
        await mesh.close()
        raise
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="edge-http")
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the edge HTTP server stopped during startup")
        await asyncio.sleep(0.02)
    where = advertised_address(join_host_port(settings.host, port), settings.advertise_address, "the edge")
    url = f"{'https' if settings.https else 'http'}://{where}"
    log.info("edge serving on %s", url)
    return EdgeServer(url=url, server=server, task=task)


async def serve(settings: EdgeSettings) -> None:
    """Run an edge until SIGTERM or SIGINT, then drain."""
    stop = lifecycle.stop_event()
    edge = await start_edge(settings)
    lifecycle.settle_heap()
    lifecycle.write_ready_file(settings.ready_file, {"url": edge.url})
    await stop.wait()
    log.info("edge draining")
    await edge.stop()
