"""The edge's head deadline on uvloop, which runs due timers before it reads
its sockets: a head that arrived while the process was held up past the
deadline is served, not cut; a connection still without a whole head
after its one extra period is closed."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tests.edge.test_http_server import serving

TIMEOUT_S = 0.3
BOUND_S = 10.0
HEAD = b"GET / HTTP/1.1\r\nHost: edge\r\n\r\n"


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"hi"})


def on_uvloop(base: type, client: Callable[[int], Awaitable[bytes]]) -> bytes:
    """``client(port)`` against ``hello`` served with the edge's protocol over
    ``base``, all on one uvloop loop; what the client read."""

    async def main() -> bytes:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with serving(base, hello, TIMEOUT_S) as port:
            return await asyncio.wait_for(client(port), BOUND_S)

    return uvloop.run(main())


async def connected(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.05)  # the server has accepted it: its deadline runs
    return reader, writer


async def held_up_after_sending(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data``, then hold the loop up past the deadline inside a socket's
    callback: the loop's next turn runs its due timers before it reads the
    server's socket again (uvloop's order), with ``data`` waiting there."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    done = loop.create_future()

    def hold_up() -> None:
        loop.remove_reader(ours.fileno())
        writer.write(data)
        time.sleep(TIMEOUT_S * 2)
        done.set_result(None)

    with ours, theirs:
        loop.add_reader(ours.fileno(), hold_up)
        theirs.send(b"x")
        await done


@pytest.mark.parametrize("base", [H11Protocol, HttpToolsProtocol])
def test_a_head_that_arrived_while_the_process_was_held_up_is_served(base: type) -> None:
    async def client(port: int) -> bytes:
        reader, writer = await connected(port)
        await held_up_after_sending(writer, HEAD)
        reply = await reader.readuntil(b"hi")
        writer.close()
        return reply

    assert on_uvloop(base, client).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("base", [H11Protocol, HttpToolsProtocol])
def test_half_a_head_held_up_gets_one_more_period_only(base: type) -> None:
    async def client(port: int) -> bytes:
        reader, writer = await connected(port)
        await held_up_after_sending(writer, HEAD[:10])
        started = time.monotonic()
        read = await reader.read()
        # Closed within the one extra period, however the trickle goes on.
        assert time.monotonic() - started < TIMEOUT_S * 3
        writer.close()
        return read

    assert on_uvloop(base, client) == b""
