"""The edge's HTTP server: a request head must arrive within the header
timeout (a slowloris client is disconnected), and it serves HTTPS when given
a certificate."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from llmmesh.edge.http_protocol import http_protocol
from llmmesh.edge.server import EdgeServer, listening_socket, start_edge
from llmmesh.edge.settings import EdgeSettings

pytestmark = pytest.mark.asyncio

# The head deadline of the servers under test. The test's client shares the server's event loop:
# a loop held up for this long before the client has sent its head (a loaded machine) closes the
# connection, as it should, so it is kept well above such a hold.
TIMEOUT_S = 1.0
# How long a test waits for what must happen; far above TIMEOUT_S.
BOUND_S = 10.0
HALF_A_HEAD = b"GET /openapi.json HTTP/1.1\r\nHost: edge\r\nUser-Agent: slow"


def protocol_bases() -> list[type]:
    bases: list[type] = [H11Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional for uvicorn
        return bases
    return [*bases, HttpToolsProtocol]


async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, then answers after longer than the header timeout."""
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await asyncio.sleep(TIMEOUT_S * 3)
    reply = b"read " + str(len(body)).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(reply)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply})


@asynccontextmanager
async def serving(base: type, app: ASGIApp = slow_app, timeout_s: float = TIMEOUT_S) -> AsyncIterator[int]:
    """``app`` on uvicorn with the edge's protocol over ``base`` and a head
    deadline of ``timeout_s``; yields the port."""
    sock = listening_socket("127.0.0.1", 0)
    config = uvicorn.Config(
        app,
        http=http_protocol(timeout_s, base),
        lifespan="off",
        log_level="warning",
        # Far longer than the test: only the header timeout can close a connection.
        timeout_keep_alive=600,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before closing; fails if it keeps the connection open."""
    return await asyncio.wait_for(reader.read(), BOUND_S)


@pytest.mark.parametrize("base", protocol_bases())
async def test_half_a_request_head_is_disconnected(base: type) -> None:
    async with serving(base) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HALF_A_HEAD)
        await writer.drain()
        # A byte now and then does not keep it open.
        for _ in range(3):
            await asyncio.sleep(TIMEOUT_S / 3)
            writer.write(b"w")
        assert await closed_by_server(reader) == b""
        writer.close()


@pytest.mark.parametrize("base", protocol_bases())
async def test_a_connection_that_sends_nothing_is_disconnected(base: type) -> None:
    async with serving(base) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader) == b""
        writer.close()


@pytest.mark.parametrize("base", protocol_bases())
async def test_slow_bodies_and_replies_are_not_cut_and_the_next_head_is_timed_again(base: type) -> None:
    async with serving(base) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: edge\r\nContent-Length: 4\r\n\r\nab")
        await asyncio.sleep(TIMEOUT_S * 2)
        writer.write(b"cd")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.readexactly(len(b"read 4")), BOUND_S) == b"read 4"
        # The connection is kept alive for a next request, whose head is timed afresh.
        writer.write(HALF_A_HEAD)
        assert await closed_by_server(reader) == b""
        writer.close()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key, and the key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmmesh test edge")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "edge.pem", directory / "edge.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


@asynccontextmanager
async def edge(**settings: object) -> AsyncIterator[EdgeServer]:
    """An edge with no mesh behind it (its global plane's address answers
    nothing): enough for what is answered before any mesh call."""
    running = await start_edge(
        EdgeSettings(port=0, global_address="127.0.0.1:9", insecure=True, **settings)  # type: ignore[arg-type]
    )
    try:
        yield running
    finally:
        await running.stop()


async def test_the_edge_disconnects_a_slow_head() -> None:
    async with edge(header_timeout_s=TIMEOUT_S) as running:
        port = int(running.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HALF_A_HEAD)
        assert await closed_by_server(reader) == b""
        writer.close()


async def test_the_edge_serves_https_with_a_certificate(tmp_path: Path) -> None:
    cert_file, key_file = self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert_file))
    async with edge(https_cert_file=str(cert_file), https_key_file=str(key_file)) as running:
        assert running.url.startswith("https://127.0.0.1:")
        async with httpx.AsyncClient(base_url=running.url, verify=trust, timeout=BOUND_S) as client:
            assert (await client.get("/openapi.json")).status_code == 200
            refused = await client.get("/v1/models")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "missing_api_key"
        plain = running.url.replace("https://", "http://")
        async with httpx.AsyncClient(base_url=plain, timeout=BOUND_S) as client:
            with pytest.raises(httpx.HTTPError):
                await client.get("/openapi.json")


@pytest.mark.parametrize(
    "settings",
    [
        lambda tmp: {"https_cert_file": str(tmp / "edge.pem")},
        lambda tmp: {"https_cert_file": str(tmp / "missing.pem"), "https_key_file": str(tmp / "missing.key")},
    ],
)
async def test_an_incomplete_or_missing_certificate_fails_the_start(
    tmp_path: Path, settings: Callable[[Path], dict[str, object]]
) -> None:
    self_signed(tmp_path)
    with pytest.raises((ValueError, OSError)):
        async with edge(**settings(tmp_path)):
            pass
