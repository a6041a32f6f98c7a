"""A plane's long-lived channels present its certificate as it is when
each call starts: after a rotation, new calls go out with the new
certificate, and calls already running on the old channel finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509

from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.renewing_channel import RenewingChannel
from tests.security.mesh_pki import EDGE, GLOBAL, Pki, make_pki

pytestmark = pytest.mark.asyncio

SERVER_NAME = role_name(Role.GLOBAL)


def _serial_of_caller(context: grpc.aio.ServicerContext) -> bytes:
    pem = context.auth_context()["x509_pem_cert"][0]
    return str(x509.load_pem_x509_certificate(pem).serial_number).encode()


async def _whoami(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _serial_of_caller(context)


async def _slow(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(int(request.decode())):
        await asyncio.sleep(0.05)
        yield _serial_of_caller(context)


async def _serve(pki: Pki) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handlers = {
        "WhoAmI": grpc.unary_unary_rpc_method_handler(_whoami),
        "Slow": grpc.unary_stream_rpc_method_handler(_slow),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Renewal", handlers),))
    port = server.add_secure_port("127.0.0.1:0", pki.security(GLOBAL).server_credentials())
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_new_calls_present_the_rotated_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server, address = await _serve(pki)
    security = pki.security(EDGE)
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    channel = RenewingChannel(
        lambda: grpc.aio.secure_channel(address, security.channel_credentials(), options=options),
        security.current_stamp,
        check_every_s=0.0,
    )
    try:
        whoami = channel.unary_unary("/test.Renewal/WhoAmI")
        slow = channel.unary_stream("/test.Renewal/Slow")
        first = await whoami(b"", timeout=5)
        assert (
            first
            == str(x509.load_pem_x509_certificate(pki.files(EDGE).cert.read_bytes()).serial_number).encode()
        )
        running = slow(b"10", timeout=10)
        assert await running.read() == first  # the stream is open on the first channel
        rotated = pki.ca.issue(EDGE)
        second = await whoami(b"", timeout=5)
        assert second != first
        assert second == str(x509.load_pem_x509_certificate(rotated.cert.read_bytes()).serial_number).encode()
        assert channel.renewals == 1
        # The stream that began before the rotation runs to its end on its own channel.
        rest = [await running.read() for _ in range(9)]
        assert await running.read() is grpc.aio.EOF
        assert len(rest) == 9 and set(rest) == {first}
        assert await running.code() == grpc.StatusCode.OK
        # Unchanged files: no more new channels.
        assert await whoami(b"", timeout=5) == second
        assert channel.renewals == 1
    finally:
        await channel.close()
        await server.stop(None)


async def test_mesh_channels_renew(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    channel = open_channel("127.0.0.1:1", pki.security(EDGE), SERVER_NAME)
    try:
        assert isinstance(channel, RenewingChannel)
    finally:
        await channel.close()
