"""The cert-rotation drill's rounds against real mTLS gRPC servers in this
process: each round re-issues every certificate, and the check sees, on new
connections, whether each server presents the certificate just issued."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from llmmesh.core.access import AccessPolicy
from llmmesh.core.certs import CertificateAuthority
from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.drill.rotation import CertRotation, TlsServer, client_context, presented_certificate, serial_of
from llmmesh.topology.mesh_certs import ensure_mesh_certs, rotate_all

pytestmark = pytest.mark.asyncio

GLOBAL = PlaneIdentity(Role.GLOBAL, "global")
REGION = PlaneIdentity(Role.REGION, "us-east", "us", "us-east")
ADMIN = PlaneIdentity(Role.ADMIN, "admin")


async def serve(security: MeshSecurity) -> GrpcServer:
    server = GrpcServer(lambda _: None, [], security=security, access=AccessPolicy({}))
    await server.start()
    return server


@pytest_asyncio.fixture
async def planes(tmp_path: Path) -> AsyncIterator[tuple[Path, tuple[TlsServer, ...]]]:
    """A global plane and a region serving mTLS with the certificates of a directory."""
    certs = ensure_mesh_certs(tmp_path / "certs", [GLOBAL, REGION, ADMIN])
    glob = await serve(MeshSecurity.mtls(certs["global"]))
    region = await serve(MeshSecurity.mtls(certs["region-us-east"]))
    servers = (
        TlsServer("global", glob.address, role_name(Role.GLOBAL)),
        TlsServer("region us-east", region.address, role_name(Role.REGION, "us", "us-east")),
    )
    try:
        yield tmp_path / "certs", servers
    finally:
        await region.stop(0)
        await glob.stop(0)


def rotation(directory: Path, servers: tuple[TlsServer, ...], rounds: int) -> CertRotation:
    admin = CertificateAuthority.open(directory).files_of(ADMIN)
    return CertRotation(rotate_all, directory, servers, rounds=rounds, every_s=0.05, admin=admin)


async def test_every_round_is_served_on_new_connections(planes: tuple[Path, tuple[TlsServer, ...]]) -> None:
    directory, servers = planes
    drill = rotation(directory, servers, rounds=3)
    before = (directory / "region-us-east.pem").read_bytes()
    await drill.disrupt()
    assert await drill.restore(30.0) is not None
    figures = drill.tally.figures()
    assert figures == {
        "cert_rotations": 3,
        "certificates_rotated": 9,
        "servers_checked": 2,
        "servers_presenting_new_cert": 2,
        "servers_not_presenting_new_cert": [],
    }
    assert (directory / "region-us-east.pem").read_bytes() != before


async def test_a_server_that_keeps_its_old_certificate_is_named(
    planes: tuple[Path, tuple[TlsServer, ...]], tmp_path: Path
) -> None:
    directory, servers = planes
    # A region serving a copy of its files: the rotation rewrites the originals, not what it serves.
    frozen = tmp_path / "frozen"
    shutil.copytree(directory, frozen)
    stuck = await serve(MeshSecurity.mtls(CertificateAuthority.open(frozen).files_of(REGION)))
    try:
        old = TlsServer("region us-east (stuck)", stuck.address, role_name(Role.REGION, "us", "us-east"))
        drill = rotation(directory, (*servers, old), rounds=1)
        await drill.disrupt()
        assert await drill.restore(30.0) is not None
    finally:
        await stuck.stop(0)
    figures = drill.tally.figures()
    assert (figures["servers_checked"], figures["servers_presenting_new_cert"]) == (3, 2)
    assert drill.tally.stale.keys() == {"region us-east (stuck)"}
    assert drill.tally.stale["region us-east (stuck)"].startswith("round 1: presents serial ")


async def test_the_check_verifies_the_name_the_server_answers_to(
    planes: tuple[Path, tuple[TlsServer, ...]],
) -> None:
    directory, (glob, _) = planes
    admin = CertificateAuthority.open(directory).files_of(ADMIN)
    context = client_context(admin)
    der = await presented_certificate(glob, context)
    assert serial_of(der) > 0
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        await presented_certificate(TlsServer("impostor", glob.address, role_name(Role.REGION)), context)
    unreachable = TlsServer("gone", "127.0.0.1:1", role_name(Role.GLOBAL))
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(presented_certificate(unreachable, context), 10)
