"""The edge's HTTP/1.1 connection protocol: uvicorn's, with a deadline on
each request head.

uvicorn times out a connection idle between requests (its keep-alive
timeout) but not one that sends a request head slowly: a client that sends
half a head, or a byte now and then, holds its connection, and the edge's
memory and file descriptors, for as long as it likes (slowloris). Here a
connection must deliver each complete request head within
``header_timeout_s`` of opening, or of the first byte after its previous
request; otherwise it is closed. Bodies and responses are not limited by
it: a streamed reply can run for minutes.

The deadline is kept by the client's bytes, not by when the edge gets to
read them. uvloop runs due timers before it polls its sockets, so a process
held up past the deadline (a long pause, a starved CPU) would meet the
deadline before the head that arrived meanwhile: a connection whose socket
still holds unread bytes when its deadline comes is given one more period
for that head, once (a client that trickles bytes gains one period, not
more).
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class _HeadDeadline(asyncio.Protocol):
    """Adds the head deadline to uvicorn's protocol classes (h11 and
    httptools alike: both keep the request in flight as ``cycle``, a new one
    for each head parsed)."""

    header_timeout_s: float
    # uvicorn's attributes this relies on.
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    _head_timer: asyncio.TimerHandle | None = None
    _head_awaited_after: Any = None
    _head_grace_taken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._between_requests():
            self._await_head()
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._head_awaited_after:
            self._stop_awaiting_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_awaiting_head()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _await_head(self) -> None:
        self._head_awaited_after = self.cycle
        self._head_grace_taken = False
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_overdue)

    def _stop_awaiting_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        # A head parsed since (by a path that bypassed data_received, such
        # as a pipelined request started later) means the deadline was met.
        if self.cycle is not self._head_awaited_after or not self._between_requests():
            return
        if not self._head_grace_taken and unread_bytes(self.transport) > 0:
            self._head_grace_taken = True
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_overdue)
            return
        self.transport.close()


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes waiting in the transport's socket, unread by the process; 0
    where that cannot be told."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", waiting)[0])


def http_protocol(
    header_timeout_s: float, base: type[asyncio.Protocol] = AutoHTTPProtocol
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class ``base`` (by default httptools when
    installed, else h11) closing connections whose request head takes longer
    than ``header_timeout_s``."""
    if not header_timeout_s > 0:
        raise ValueError("header_timeout_s must be positive")
    return type(
        "EdgeHttpProtocol",
        (_HeadDeadline, base),
        {"header_timeout_s": header_timeout_s, "__module__": __name__},
    )
