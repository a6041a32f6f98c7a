"""The edge's listening socket: connections it accepts send each write at
once (no Nagle delay waiting for the client's ACK of the previous chunk)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from llmmesh.edge.server import listening_socket


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_accepted_connections_have_nagle_off(host: str) -> None:
    try:
        sock = listening_socket(host, 0)
    except OSError as err:  # a machine without IPv6 loopback
        pytest.skip(f"cannot bind {host}: {err}")
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            raw = transport.get_extra_info("socket")
            accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection(host, port)
        try:
            assert await asyncio.wait_for(accepted, 5) != 0
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_port_in_use_is_an_error_and_leaks_no_socket() -> None:
    first = listening_socket("127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="in use"):
            listening_socket("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
