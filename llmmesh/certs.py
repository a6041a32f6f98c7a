"""The mesh's certificate authority: one CA per mesh, one certificate per
plane naming its identity (:mod:`llmmesh.identity`).

A certificate directory holds ``ca.pem`` (the trust bundle: every CA a
plane accepts), ``ca.key`` (the signing key, kept only where certificates
are issued) and, per identity, ``STEM.pem`` (leaf then CA) and ``STEM.key``.
Writes are atomic (a temporary file renamed over the old one), so a plane
reloading its files mid-rotation reads an old pair or a new one, never half;
the key is renamed before the certificate, and a reader that finds the two
disagreeing keeps what it had until they agree.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmmesh.core.identity import PlaneIdentity, Role

CA_DAYS = 3650
LEAF_DAYS = 30
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class CertFiles:
    """Where one holder's certificate, key and trust bundle are."""

    cert: Path
    key: Path
    ca: Path

    def exist(self) -> bool:
        return self.cert.is_file() and self.key.is_file() and self.ca.is_file()


def stem_of(identity: PlaneIdentity) -> str:
    """The file stem of an identity's certificate: ``ROLE`` or ``ROLE-NAME``."""
    if identity.name == identity.role.value:
        return identity.role.value
    return f"{identity.role}-{identity.name}"


def _write_atomic(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CertificateAuthority:
    """A CA in a certificate directory; :meth:`open` creates it on first use."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.directory = directory
        self._key = key
        self.cert = cert

    @classmethod
    def open(cls, directory: Path, *, mesh_name: str = "llmmesh") -> CertificateAuthority:
        """The CA of ``directory``, created (key, self-signed certificate,
        trust bundle) if the directory has none."""
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        key_path, cert_path = directory / "ca.key", directory / "ca-cert.pem"
        if key_path.is_file() and cert_path.is_file():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_path}: not an EC private key")
            return cls(directory, key, x509.load_pem_x509_certificate(cert_path.read_bytes()))
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{mesh_name} mesh CA")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write_atomic(key_path, _pem_key(key), private=True)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        _write_atomic(cert_path, pem)
        bundle = directory / "ca.pem"
        if not bundle.is_file():
            _write_atomic(bundle, pem)
        return cls(directory, key, cert)

    def files_of(self, identity: PlaneIdentity) -> CertFiles:
        stem = stem_of(identity)
        d = self.directory
        return CertFiles(d / f"{stem}.pem", d / f"{stem}.key", d / "ca.pem")

    def issue(
        self, identity: PlaneIdentity, *, hosts: tuple[str, ...] = (), days: int = LEAF_DAYS
    ) -> CertFiles:
        """Issue (or re-issue: that is rotation) ``identity``'s certificate;
        ``hosts`` are extra DNS names it answers to."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
        sans += [x509.DNSName(n) for n in [*identity.dns_names, *hosts]]
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if identity.role not in (Role.ADMIN, Role.CLIENT):
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        files = self.files_of(identity)
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(
            serialization.Encoding.PEM
        )
        _write_atomic(files.key, _pem_key(key), private=True)
        _write_atomic(files.cert, chain)
        return files


def identity_of_pem(pem: bytes) -> PlaneIdentity | None:
    """The mesh identity a PEM certificate (its first) names in its URI SAN, if any."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        try:
            return PlaneIdentity.parse(uri)
        except ValueError:
            continue
    return None


def not_after(pem: bytes) -> dt.datetime:
    """When a PEM certificate (its first) expires."""
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc
