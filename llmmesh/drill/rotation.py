"""Rotating every certificate of the mesh under load (``--kind cert-rotation``),
and checking that the planes really serve the new ones.

A round re-issues every leaf certificate of the mesh's certificate
directory (``rotate``, which the command line gives as
:func:`llmmesh.cli.certs.rotate_all`: same CA, same identities, new
keys). Running planes pick the new files up on their next TLS handshake,
without a restart; connections already open go on with the old
certificates, which stay valid. The drill runs ``rotations`` rounds,
``rotate_every_s`` apart, while the traffic streams.

After each round the drill opens a new TLS connection to every gRPC
server it knows (the global plane, each region, each pod), presenting the
admin certificate and checking the server's name and chain as a plane
would, and compares the certificate the server presents with the one the
round just wrote for that identity (the same DER, so the same serial
number and fingerprint). A server still presenting an older certificate
is asked again for up to :data:`CHECK_GRACE_S`; after that it counts as
stale in that round. ``servers_presenting_new_cert`` counts the servers
that presented the new certificate after every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llmmesh.core.certs import CertFiles, identity_of_pem, stem_of
from llmmesh.core.identity import PlaneIdentity
from llmmesh.drill.disruption import Disruption

CHECK_TIMEOUT_S = 5.0
"""Longest one TLS handshake of a check may take."""
CHECK_GRACE_S = 2.0
"""How long a server may go on presenting an older certificate after a round."""
CHECK_RETRY_S = 0.1
MAX_STALE_SHOWN = 10
Rotate = Callable[[Path], list[PlaneIdentity]]
"""Re-issues every certificate of a directory; the identities re-issued."""


@dataclass(frozen=True)
class TlsServer:
    """A gRPC server of the mesh whose certificate the drill checks."""

    name: str
    """What the report calls it: ``global``, ``region us-east``, ``pod us-east-pod-0``."""
    address: str
    server_name: str
    """The DNS name it must answer to (:func:`llmmesh.core.identity.role_name`)."""


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _leaf_der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def serial_of(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


async def presented_certificate(server: TlsServer, context: ssl.SSLContext) -> bytes:
    """The leaf certificate (DER) ``server`` presents on a new connection;
    OSError or ssl.SSLError when it cannot be reached or fails the checks."""
    host, port = _host_port(server.address)
    async with asyncio.timeout(CHECK_TIMEOUT_S):
        _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=server.server_name)
    try:
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await writer.wait_closed()
    if not der:
        raise ssl.SSLError(f"{server.name} presented no certificate")
    return bytes(der)


def client_context(holder: CertFiles) -> ssl.SSLContext:
    """A TLS client context as a plane's: the mesh CA, the server's name checked, ``holder`` presented."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(holder.ca))
    context.load_cert_chain(str(holder.cert), str(holder.key))
    context.set_alpn_protocols(["h2"])
    return context


@dataclass
class RotationTally:
    """What the rounds did and what the servers presented after them."""

    rounds: int = 0
    certificates_rotated: int = 0
    servers: tuple[str, ...] = ()
    stale: dict[str, str] = field(default_factory=dict)
    """Servers that did not present the new certificate after some round, and why (the first time)."""

    def figures(self) -> dict[str, object]:
        shown = [{"server": name, "why": why} for name, why in list(self.stale.items())[:MAX_STALE_SHOWN]]
        return {
            "cert_rotations": self.rounds,
            "certificates_rotated": self.certificates_rotated,
            "servers_checked": len(self.servers),
            "servers_presenting_new_cert": len(self.servers) - len(self.stale),
            "servers_not_presenting_new_cert": shown,
        }

    def held(self, rounds: int) -> bool:
        """Every one of ``rounds`` ran, and every server checked presented the new certificates."""
        return self.rounds == rounds and bool(self.servers) and not self.stale


class CertRotation(Disruption):
    """Rotates every certificate of ``certs_dir`` with ``rotate``, ``rounds``
    times ``every_s`` apart, checking ``servers`` after each round with the
    ``admin`` certificate."""

    def __init__(
        self,
        rotate: Rotate,
        certs_dir: Path,
        servers: tuple[TlsServer, ...],
        *,
        rounds: int,
        every_s: float,
        admin: CertFiles,
    ) -> None:
        self._rotate = rotate
        self._dir = certs_dir
        self._servers = servers
        self._rounds = rounds
        self._every_s = every_s
        self._admin = admin
        self._task: asyncio.Task[None] | None = None
        self._issued: dict[PlaneIdentity, bytes] = {}
        """The leaf certificate (DER) of each identity the last round re-issued."""
        self.tally = RotationTally(servers=tuple(s.name for s in servers))
        self.description = f"every certificate in {certs_dir}, {rounds} times {every_s:g} s apart"

    async def disrupt(self) -> None:
        await self._round()
        self._task = asyncio.create_task(self._more(), name="drill-cert-rotation")

    async def _more(self) -> None:
        for _ in range(self._rounds - 1):
            await asyncio.sleep(self._every_s)
            await self._round()

    async def restore(self, timeout_s: float) -> float | None:
        """Wait for the last round (and its check) to end."""
        assert self._task is not None
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._task)
        except TimeoutError:
            return None
        return time.monotonic()

    async def release(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _round(self) -> None:
        # Key generation and file writes off the event loop: the traffic's streams run on it.
        rotated = await asyncio.to_thread(self._rotate, self._dir)
        issued = self._issued = await asyncio.to_thread(self._leaves, rotated)
        self.tally.rounds += 1
        self.tally.certificates_rotated += len(rotated)
        context = await asyncio.to_thread(client_context, self._admin)
        for server in self._servers:
            why = await self._check(server, context, issued)
            if why and server.name not in self.tally.stale:
                self.tally.stale[server.name] = f"round {self.tally.rounds}: {why}"

    def _leaves(self, rotated: list[PlaneIdentity]) -> dict[PlaneIdentity, bytes]:
        """The leaf certificate (DER) each rotated identity has now."""
        return {ident: _leaf_der((self._dir / f"{stem_of(ident)}.pem").read_bytes()) for ident in rotated}

    async def _check(
        self, server: TlsServer, context: ssl.SSLContext, issued: dict[PlaneIdentity, bytes]
    ) -> str:
        """Why ``server`` does not present the certificate just issued for it; empty when it does."""
        deadline = time.monotonic() + CHECK_GRACE_S
        while True:
            try:
                der = await presented_certificate(server, context)
            except (OSError, ssl.SSLError, TimeoutError) as err:
                why = f"no TLS handshake: {' '.join(str(err).split()) or type(err).__name__}"
            else:
                identity = identity_of_pem(ssl.DER_cert_to_PEM_cert(der).encode())
                new = issued.get(identity) if identity is not None else None
                if new is not None and der == new:
                    return ""
                why = (
                    f"presents serial {serial_of(der):x}, not the new {serial_of(new):x}"
                    if new is not None
                    else f"presents a certificate of {identity}, which the rotation did not issue"
                )
            if time.monotonic() >= deadline:
                return why
            await asyncio.sleep(CHECK_RETRY_S)
