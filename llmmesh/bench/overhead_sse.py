"""A lean streaming client of an OpenAI-compatible chat endpoint: HTTP/1.1
on asyncio streams, keep-alive connections, chunked bodies, server-sent
events parsed as they arrive.

Why not httpx (:mod:`llmmesh.bench.openai_client`): the benchmark runs on
the same cores as the mesh it measures, and httpx spends more CPU on each
streamed chunk (its decoders, cancel scopes, per-response cookie and
charset handling) than the edge spends producing it. Through the full path
at 16 streams the httpx client kept a core busy on its own and its queueing
showed up as the mesh's latency. This client does only what an SSE stream
needs, so that what it measures is the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from llmmesh.bench.openai_client import ChunkCounter, chat_body
from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest

_DATA = b"data:"
_DONE = b"[DONE]"
_MAX_ERROR_BODY = 200
# W3C trace flags: sampled, not sampled.
TRACE_FLAGS = ("01", "00")


class ProtocolError(Exception):
    """The server's answer is not the HTTP this client understands."""


class _StaleConnection(Exception):
    """A kept-alive connection the server had closed before it was reused."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


@dataclass
class _Head:
    status: int
    chunked: bool
    content_length: int | None
    keep_alive: bool


async def _read_head(reader: asyncio.StreamReader, reused: bool) -> _Head:
    status_line = await reader.readline()
    if not status_line and reused:
        raise _StaleConnection
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    chunked, length, keep_alive = False, None, True
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"content-length":
            length = int(value)
        elif name == b"connection":
            keep_alive = value != b"close"
    return _Head(int(parts[1]), chunked, length, keep_alive)


class SseChatClient:
    """Streams chat completions from ``base_url`` (``http://host:port``)
    for ``model``, authenticated by ``api_key``; ``chunk_counter`` makes
    each stream's token counter. Requests are the same JSON bodies as
    :func:`llmmesh.bench.openai_client.chat_body` (greedy, ``ignore_eos``
    unless told not to, the usage at the end of the stream: the edge refuses vLLM's per-chunk
    usage, so ``chunk_counter`` counts the chunks). Each is bounded by
    ``request_timeout_s``. With ``trace_flags``, every request carries a
    W3C ``traceparent`` of a trace of its own, as a traced client of the
    mesh sends it, with the flags ``trace_flags`` gives for the request
    (``01`` sampled, ``00`` not)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str,
        request_timeout_s: float,
        chunk_counter: Callable[[], ChunkCounter] = ChunkCounter,
        trace_flags: Callable[[ChatRequest], str] | None = None,
        ignore_eos: bool = True,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None or url.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port = url.hostname, url.port
        self._model = model
        self._head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
        )
        self._trace_flags = trace_flags
        self._timeout_s = request_timeout_s
        self._chunk_counter = chunk_counter
        self._idle: list[_Connection] = []
        self._ignore_eos = ignore_eos

    async def generate(self, request: ChatRequest) -> RequestRecord:
        """See :class:`llmmesh.bench.loadgen.StreamingClient`: a stream that
        ends without ``data: [DONE]`` is a failure (recorded, not raised)."""
        body = json.dumps(
            chat_body(self._model, request, continuous_usage=False, ignore_eos=self._ignore_eos)
        ).encode()
        head = f"{self._head}{self._traceparent(request)}Content-Length: {len(body)}\r\n\r\n".encode()
        record = RequestRecord(sent_at=time.perf_counter())
        connection: _Connection | None = None
        reusable = False
        try:
            async with asyncio.timeout(self._timeout_s):
                connection, reused = await self._connection()
                try:
                    reusable = await self._exchange(connection, head + body, record, reused)
                except (_StaleConnection, ConnectionResetError, BrokenPipeError):
                    if not reused:
                        raise
                    # The server closed it as it was taken: once more on a new one.
                    connection.close()
                    connection = await self._connect()
                    reusable = await self._exchange(connection, head + body, record, reused=False)
        except TimeoutError:
            record.fail(f"no complete reply within {self._timeout_s:.0f} s")
        except (OSError, asyncio.IncompleteReadError, ProtocolError) as err:
            record.fail(f"{type(err).__name__}: {err}")
        except ValueError as err:  # a chunk that is not JSON, a bad chunk size
            record.fail(f"malformed reply: {err}")
        finally:
            if connection is not None:
                if reusable:
                    self._idle.append(connection)
                else:
                    connection.close()
        if record.finished_at is None:
            record.fail("the stream ended without data: [DONE]")
        return record

    async def _connection(self) -> tuple[_Connection, bool]:
        """A kept-alive connection the server has not closed (True), else a new one."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.reader.at_eof() and not connection.writer.is_closing():
                return connection, True
            connection.close()
        return await self._connect(), False

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Connection(reader, writer)

    async def _exchange(
        self, connection: _Connection, request: bytes, record: RequestRecord, reused: bool
    ) -> bool:
        """Send one request (head and body) and follow its reply to the end; True when the
        connection can carry another request. Raises _StaleConnection when a
        ``reused`` connection turns out closed before any answer."""
        writer, reader = connection.writer, connection.reader
        writer.write(request)
        await writer.drain()
        head = await _read_head(reader, reused)
        events = _SseEvents(record, self._chunk_counter())
        if head.chunked:
            while size := int((await reader.readline()).split(b";")[0], 16):
                events.feed(await reader.readexactly(size), time.perf_counter())
                await reader.readexactly(2)  # the CRLF after each chunk
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
        elif head.content_length is not None:
            events.feed(await reader.readexactly(head.content_length), time.perf_counter())
        else:
            events.feed(await reader.read(), time.perf_counter())
            return False
        if head.status != 200:
            record.fail(f"HTTP {head.status}: {events.raw[:_MAX_ERROR_BODY].decode(errors='replace')}")
        return head.keep_alive

    def _traceparent(self, request: ChatRequest) -> str:
        """The request's ``traceparent`` header line, or nothing."""
        if self._trace_flags is None:
            return ""
        flags = self._trace_flags(request)
        if flags not in TRACE_FLAGS:
            raise ValueError(f"trace flags must be one of {', '.join(TRACE_FLAGS)}, not {flags!r}")
        return f"traceparent: 00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{flags}\r\n"

    async def close(self) -> None:
        for connection in self._idle:
            connection.close()
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()
        self._idle.clear()


class _SseEvents:
    """Server-sent events of one reply, fed as the body arrives: each
    ``data:`` payload is a chunk (tokens counted, errors recorded) or
    ``[DONE]``."""

    def __init__(self, record: RequestRecord, counter: ChunkCounter) -> None:
        self._record = record
        self._counter = counter
        self._buffer = b""
        self.raw = b""

    def feed(self, data: bytes, at: float) -> None:
        """Take the next piece of the body, received at ``at``."""
        if len(self.raw) < _MAX_ERROR_BODY:
            self.raw += data[:_MAX_ERROR_BODY]
        self._buffer += data
        *events, self._buffer = self._buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(_DATA):
                    self._data(line[len(_DATA) :].strip(), at)

    def _data(self, payload: bytes, at: float) -> None:
        if payload == _DONE:
            self._record.finish(at)
            return
        chunk: Any = json.loads(payload)
        if not isinstance(chunk, dict):
            raise ValueError("a chunk that is not a JSON object")
        if "error" in chunk:
            self._record.fail(f"error event: {chunk['error']}")
            return
        self._record.add_tokens(at, self._counter.tokens_in(chunk))
