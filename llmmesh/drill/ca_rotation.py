"""Rotating the mesh CA under load (``--kind ca-rotation``), and checking
that the planes take the new CA and refuse the old one once it is retired.

Three steps, ``every_s`` apart (:class:`CaSteps`, which the command line
gives from :mod:`llmmesh.topology.mesh_certs`): the new CA goes into the
trust bundle beside the old one; every leaf certificate is re-issued from
it; the old CA leaves the bundle. Planes re-read the bundle with their
certificates (:mod:`llmmesh.core.mtls`), so while both CAs are trusted a
peer with either CA's certificate is accepted, and no turn fails.

After the re-issue, and again after the retirement, every gRPC server is
asked on a new connection for its certificate, as in
:mod:`llmmesh.drill.rotation`, and must present the one the new CA just
issued. After the retirement each server is also offered the admin
certificate of the old CA (kept from before the re-issue) and must refuse
it: ``servers_refusing_old_ca`` counts those that did.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmmesh.core.certs import CertFiles
from llmmesh.core.identity import PlaneIdentity
from llmmesh.drill.rotation import (
    CHECK_TIMEOUT_S,
    MAX_STALE_SHOWN,
    CertRotation,
    Rotate,
    RotationTally,
    TlsServer,
    client_context,
)


@dataclass(frozen=True)
class CaSteps:
    """The steps of a CA rotation, each given the planes' certificate directory."""

    ca_dir: Path
    """Where the CA's key is kept (checked before the drill starts)."""
    trust: Callable[[Path], object]
    """A new CA, trusted beside the old one; nothing issued from it yet."""
    reissue: Rotate
    """Every certificate re-issued from the new CA; the identities re-issued."""
    retire: Callable[[Path], object]
    """Every CA but the new one out of the bundle."""


@dataclass
class CaRotationTally(RotationTally):
    """A :class:`RotationTally` (one round: the re-issue) and who refused the old CA after its retirement."""

    retired: bool = False
    accepting_old: dict[str, str] = field(default_factory=dict)
    """Servers that did not refuse the old CA's certificate after the retirement, and why."""

    def figures(self) -> dict[str, object]:
        shown = [{"server": s, "why": w} for s, w in list(self.accepting_old.items())[:MAX_STALE_SHOWN]]
        return {
            **super().figures(),
            "old_ca_retired": self.retired,
            "servers_refusing_old_ca": len(self.servers) - len(self.accepting_old) if self.retired else 0,
            "servers_accepting_old_ca": shown,
        }

    def held(self, rounds: int) -> bool:
        return super().held(1) and self.retired and not self.accepting_old


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""A client's HTTP/2 connection preface and empty SETTINGS frame."""


async def refuses(server: TlsServer, context: ssl.SSLContext) -> str:
    """Why ``server`` is taken to accept a client of ``context``; empty when it refuses it.

    In TLS 1.3 the server judges the client's certificate after the
    client's side of the handshake is done, so a refusal shows as an alert
    or a closed connection on the first read; a gRPC server that accepts
    answers the HTTP/2 preface with its settings instead."""
    host, _, port = server.address.rpartition(":")
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                host.strip("[]"), int(port), ssl=context, server_hostname=server.server_name
            )
    except (ssl.SSLError, ConnectionError):
        return ""
    except (OSError, TimeoutError) as err:
        return f"no answer: {' '.join(str(err).split()) or type(err).__name__}"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            writer.write(_HTTP2_PREFACE)
            await writer.drain()
            data = await reader.read(1)
    except (ssl.SSLError, ConnectionError):
        return ""
    except (OSError, TimeoutError) as err:
        return f"no answer: {' '.join(str(err).split()) or type(err).__name__}"
    finally:
        # Dropped, not shut down: a peer need not answer a TLS close, and the check is over.
        writer.transport.abort()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await writer.wait_closed()
    return "served a client of the retired CA" if data else ""


class CaRotation(CertRotation):
    """Rotates the CA of ``certs_dir`` with ``steps``, ``every_s`` apart,
    checking ``servers`` with the ``admin`` certificate (see the module docstring)."""

    tally: CaRotationTally

    def __init__(
        self,
        steps: CaSteps,
        certs_dir: Path,
        servers: tuple[TlsServer, ...],
        *,
        every_s: float,
        admin: CertFiles,
    ) -> None:
        super().__init__(steps.reissue, certs_dir, servers, rounds=1, every_s=every_s, admin=admin)
        self._steps = steps
        self.tally = CaRotationTally(servers=tuple(s.name for s in servers))
        self.description = (
            f"the mesh CA of {certs_dir}: a new CA trusted, every certificate re-issued from it, "
            f"the old CA retired, {every_s:g} s apart"
        )
        self._old_admin: tuple[bytes, bytes] | None = None

    async def disrupt(self) -> None:
        admin = self._admin
        self._old_admin = await asyncio.to_thread(lambda: (admin.cert.read_bytes(), admin.key.read_bytes()))
        await asyncio.to_thread(self._steps.trust, self._dir)
        self._task = asyncio.create_task(self._more(), name="drill-ca-rotation")

    async def _more(self) -> None:
        await asyncio.sleep(self._every_s)
        issued = await self._reissue()
        await asyncio.sleep(self._every_s)
        await asyncio.to_thread(self._steps.retire, self._dir)
        self.tally.retired = True
        context = await asyncio.to_thread(client_context, self._admin)
        old = await asyncio.to_thread(self._old_context)
        for server in self._servers:
            why = await self._check(server, context, issued)
            if why and server.name not in self.tally.stale:
                self.tally.stale[server.name] = f"after the retirement: {why}"
            refusal = await refuses(server, old)
            if refusal:
                self.tally.accepting_old[server.name] = refusal

    async def _reissue(self) -> dict[PlaneIdentity, bytes]:
        await self._round()
        return self._issued

    def _old_context(self) -> ssl.SSLContext:
        """A client context presenting the old CA's admin certificate, trusting the bundle now."""
        assert self._old_admin is not None
        with tempfile.TemporaryDirectory() as scratch:
            cert, key = Path(scratch) / "old.pem", Path(scratch) / "old.key"
            cert.write_bytes(self._old_admin[0])
            key.write_bytes(self._old_admin[1])
            return client_context(CertFiles(cert, key, self._admin.ca))
