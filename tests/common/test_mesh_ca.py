"""The mesh CA kept apart from the planes' certificates, and its rotation:
a new CA trusted beside the old while every certificate is re-issued from
it, then the old one retired, against a real mTLS gRPC server."""

from __future__ import annotations

import argparse
import shutil
import ssl
import stat
from pathlib import Path

import pytest

from llmmesh.cli.certs import add_certs_arguments, run_certs
from llmmesh.core.access import AccessPolicy
from llmmesh.core.certs import CaLayoutError, CertFiles, CertificateAuthority, issued_by, read_bundle
from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.drill.ca_rotation import refuses
from llmmesh.drill.rotation import TlsServer, client_context, presented_certificate
from llmmesh.topology.mesh_certs import ensure_mesh_certs, retire_old_cas, rotate_all, trust_new_ca

GLOBAL = PlaneIdentity(Role.GLOBAL, "global")
ADMIN = PlaneIdentity(Role.ADMIN, "admin")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _certs(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_certs_arguments(parser)
    status = run_certs(parser.parse_args(argv))
    out = capsys.readouterr()
    return status, out.out + out.err


def test_the_key_lies_apart_from_the_planes_files(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    files = ensure_mesh_certs(certs, [GLOBAL])["global"]
    assert sorted(p.name for p in certs.iterdir()) == ["ca.pem", "global.key", "global.pem"]
    keys = tmp_path / "ca"
    assert sorted(p.name for p in keys.iterdir()) == ["ca-cert.pem", "ca.key"]
    assert _mode(keys) == 0o700
    assert _mode(keys / "ca.key") == _mode(keys / "ca-cert.pem") == 0o600
    ca = CertificateAuthority.open(certs)
    assert issued_by(files.cert.read_bytes(), ca.cert) and read_bundle(files.ca) == [ca.cert]
    with pytest.raises(CaLayoutError, match="must not be the planes' certificate directory"):
        CertificateAuthority.open(certs, ca_dir=certs)


def test_a_key_of_the_older_layout_is_moved_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    certs, keys = tmp_path / "certs", tmp_path / "ca"
    ensure_mesh_certs(certs, [GLOBAL])
    signing = (keys / "ca.key").read_bytes()
    for name in ("ca.key", "ca-cert.pem"):
        shutil.move(keys / name, certs / name)
    keys.rmdir()
    status, out = _certs(["list", "--dir", str(certs)], capsys)
    assert status == 0 and f"moved the CA key out of {certs} into {keys}" in out
    assert not (certs / "ca.key").exists() and not (certs / "ca-cert.pem").exists()
    assert (keys / "ca.key").read_bytes() == signing and _mode(keys / "ca.key") == 0o600
    # The same CA: what it issued before still is its own, and nothing is re-issued.
    before = (certs / "global.pem").read_bytes()
    ensure_mesh_certs(certs, [GLOBAL])
    assert (certs / "global.pem").read_bytes() == before
    # A second, different key in the planes' directory is refused, not merged.
    (certs / "ca.key").write_bytes(b"another key")
    status, out = _certs(["list", "--dir", str(certs)], capsys)
    assert status == 2 and "two different CA keys" in out


@pytest.mark.asyncio
async def test_a_ca_rotation_trusts_both_cas_until_the_old_is_retired(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    held = ensure_mesh_certs(certs, [GLOBAL, ADMIN])
    old_ca = CertificateAuthority.open(certs).cert
    # An admin that keeps its certificate of the old CA through the rotation.
    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("admin.pem", "admin.key"):
        shutil.copy(certs / name, kept / name)
    old_admin = CertFiles(kept / "admin.pem", kept / "admin.key", certs / "ca.pem")
    security = MeshSecurity.mtls(held["global"])
    server = GrpcServer(lambda _: None, [], security=security, access=AccessPolicy({}))
    await server.start()
    target = TlsServer("global", server.address, role_name(Role.GLOBAL))
    try:
        change = trust_new_ca(certs)
        assert change.trusted == [old_ca, change.ca] == read_bundle(certs / "ca.pem")
        # Nothing is issued from the new CA yet, so the old one cannot be retired.
        with pytest.raises(CaLayoutError, match=r"admin\.pem, global\.pem not issued by the current CA"):
            retire_old_cas(certs)
        assert sorted(i.uri for i in rotate_all(certs)) == sorted([ADMIN.uri, GLOBAL.uri])
        leaf = (certs / "global.pem").read_bytes()
        assert issued_by(leaf, change.ca) and not issued_by(leaf, old_ca)
        # The overlap: the server presents the new CA's certificate, and both admins are served.
        presented = await presented_certificate(target, client_context(held["admin"]))
        assert issued_by(ssl.DER_cert_to_PEM_cert(presented).encode(), change.ca)
        assert await refuses(target, client_context(old_admin)) == "served a client of the retired CA"
        assert retire_old_cas(certs) == [old_ca]
        assert read_bundle(certs / "ca.pem") == [change.ca]
        # Retired: the new CA's admin is served, the old CA's refused.
        assert await refuses(target, client_context(held["admin"])) == "served a client of the retired CA"
        assert await refuses(target, client_context(old_admin)) == ""
        assert retire_old_cas(certs) == []
    finally:
        await server.stop(0)
