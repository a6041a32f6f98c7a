"""The mesh's certificate authority: one CA per mesh, one certificate per
plane naming its identity (:mod:`llmmesh.core.identity`).

The planes' certificate directory holds ``ca.pem`` (the trust bundle:
every CA a plane accepts) and, per identity, ``STEM.pem`` (leaf then CA)
and ``STEM.key``. The CA's own directory (mode 0700, default ``ca`` beside
the planes' one, :func:`default_ca_dir`) holds ``ca.key`` (the signing
key) and ``ca-cert.pem``, each mode 0600; it is never the planes'
directory, so a plane (or a pod mounting that directory) never holds the
key. A planes' directory of the older layout, with ``ca.key`` in it, has
the key moved out by :meth:`CertificateAuthority.open`.

Rotating the CA (:meth:`CertificateAuthority.begin_rotation`) puts a new
CA into the bundle beside the old one before anything is issued from it,
so during the overlap a plane with either CA's certificate is accepted;
:meth:`CertificateAuthority.retire_others` then leaves the new CA alone in
the bundle. Writes are atomic (a temporary file renamed over the old one), so a plane
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
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmmesh.core.identity import PlaneIdentity, Role

CA_DAYS = 3650
LEAF_DAYS = 30
_BACKDATE = dt.timedelta(minutes=5)
CA_KEY = "ca.key"
CA_CERT = "ca-cert.pem"
BUNDLE = "ca.pem"


class CaLayoutError(ValueError):
    """The CA's files are not where, or not what, the layout says."""


def default_ca_dir(certs: Path) -> Path:
    """Where the CA of the planes' directory ``certs`` is kept unless told: ``ca`` beside it."""
    return certs.parent / "ca"


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


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


def move_ca_key(certs: Path, ca_dir: Path) -> bool:
    """Move the CA key and certificate that the older layout kept in the
    planes' directory ``certs`` into ``ca_dir``; whether there was one.
    CaLayoutError when ``ca_dir`` already holds another key."""
    old_key, old_cert = certs / CA_KEY, certs / CA_CERT
    if not old_key.is_file():
        return False
    _private_dir(ca_dir)
    key, cert = ca_dir / CA_KEY, ca_dir / CA_CERT
    if not key.is_file():
        if old_cert.is_file():
            _write_atomic(cert, old_cert.read_bytes(), private=True)
        _write_atomic(key, old_key.read_bytes(), private=True)
    elif key.read_bytes() != old_key.read_bytes():
        raise CaLayoutError(f"{old_key} and {key} are two different CA keys: keep the mesh's, in {ca_dir}")
    old_key.unlink()
    old_cert.unlink(missing_ok=True)
    return True


def read_bundle(path: Path) -> list[x509.Certificate]:
    """The CA certificates of a trust bundle (none when there is no file)."""
    return x509.load_pem_x509_certificates(path.read_bytes()) if path.is_file() else []


def _write_bundle(path: Path, cas: list[x509.Certificate]) -> None:
    _write_atomic(path, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in cas))


def issued_by(pem: bytes, ca: x509.Certificate) -> bool:
    """Whether ``ca`` signed the first certificate of ``pem``."""
    try:
        x509.load_pem_x509_certificate(pem).verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _new_ca(mesh_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    # A name of its own per CA: during a rotation the bundle holds two, and a peer picks the issuer by name.
    common = f"{mesh_name} mesh CA {os.urandom(4).hex()}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])
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
    return key, cert


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CertificateAuthority:
    """The CA kept in ``ca_dir`` that issues into the planes' directory
    ``directory``; :meth:`open` creates it on first use."""

    def __init__(
        self, directory: Path, ca_dir: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate
    ) -> None:
        self.directory = directory
        self.ca_dir = ca_dir
        self._key = key
        self.cert = cert
        self.moved_key = False
        """Whether :meth:`open` moved the key out of the planes' directory (the older layout)."""

    @classmethod
    def open(
        cls, directory: Path, *, ca_dir: Path | None = None, mesh_name: str = "llmmesh"
    ) -> CertificateAuthority:
        """The CA of ``ca_dir`` (default :func:`default_ca_dir`), created (key,
        self-signed certificate) if it has none, issuing into ``directory``,
        whose trust bundle is made to hold it. A key found in ``directory``
        is moved to ``ca_dir`` first; CaLayoutError when the two are one
        directory, or the key and certificate disagree."""
        ca_dir = ca_dir or default_ca_dir(directory)
        if ca_dir.resolve() == directory.resolve():
            raise CaLayoutError(f"the CA directory must not be the planes' certificate directory {directory}")
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        moved = move_ca_key(directory, ca_dir)
        _private_dir(ca_dir)
        key_path, cert_path = ca_dir / CA_KEY, ca_dir / CA_CERT
        if key_path.is_file() and cert_path.is_file():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise CaLayoutError(f"{key_path}: not an EC private key")
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if cert.public_key() != key.public_key():
                raise CaLayoutError(f"{key_path} is not the key of {cert_path}")
        else:
            key, cert = _new_ca(mesh_name)
            _write_atomic(key_path, _pem_key(key), private=True)
            _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=True)
        bundle = read_bundle(directory / BUNDLE)
        if cert not in bundle:
            # A CA the bundle lacks would issue certificates no plane accepts.
            _write_bundle(directory / BUNDLE, [*bundle, cert])
        ca = cls(directory, ca_dir, key, cert)
        ca.moved_key = moved
        return ca

    def begin_rotation(self, *, mesh_name: str = "llmmesh") -> CertificateAuthority:
        """A new CA, trusted beside this one: the bundle gets it first, then
        ``ca_dir`` its key and certificate (replacing this CA's, which
        issues nothing more). Certificates this CA issued stay accepted
        until :meth:`retire_others`."""
        key, cert = _new_ca(mesh_name)
        _write_bundle(self.directory / BUNDLE, [*read_bundle(self.directory / BUNDLE), cert])
        _write_atomic(self.ca_dir / CA_KEY, _pem_key(key), private=True)
        _write_atomic(self.ca_dir / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), private=True)
        return CertificateAuthority(self.directory, self.ca_dir, key, cert)

    def retire_others(self) -> list[x509.Certificate]:
        """Leave this CA alone in the bundle; the CAs dropped from it."""
        bundle = read_bundle(self.directory / BUNDLE)
        dropped = [c for c in bundle if c != self.cert]
        if dropped or bundle != [self.cert]:
            _write_bundle(self.directory / BUNDLE, [self.cert])
        return dropped

    def files_of(self, identity: PlaneIdentity) -> CertFiles:
        stem = stem_of(identity)
        d = self.directory
        return CertFiles(d / f"{stem}.pem", d / f"{stem}.key", d / BUNDLE)

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
