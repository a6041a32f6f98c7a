"""Mutual TLS between planes: each server asks every caller for a mesh
certificate, each channel presents its plane's own, and both sides check
the other against the mesh CA.

Servers re-read their certificate files when they change (checked on each
new connection), so a rotated certificate is served without a restart;
channels read the files when they open, and a rotated peer keeps working
on connections that are already open, since the old certificate stays
valid until it expires. Plaintext is :meth:`MeshSecurity.insecure`, which
the processes use only when told to (``--insecure``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import grpc
import grpc.aio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llmmesh.core.certs import CertFiles, identity_of_pem
from llmmesh.core.config import setting
from llmmesh.core.grpc_tracing import client_interceptors
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import IdentityError, PlaneIdentity, Role
from llmmesh.core.renewing_channel import RenewingChannel

log = logging.getLogger(__name__)


class TlsSetupError(ValueError):
    """A plane cannot serve or dial securely with what it was given."""


@dataclass(frozen=True)
class MeshTlsSettings:
    """The settings every plane has for its mesh identity."""

    tls_cert: str = setting(
        "", "this plane's certificate (PEM, leaf first); empty: $LLMMESH_HOME/certs/<plane>.pem"
    )
    tls_key: str = setting("", "this plane's private key (PEM); empty: beside the certificate, .key")
    tls_ca: str = setting("", "the mesh CA bundle (PEM); empty: ca.pem beside the certificate")
    insecure: bool = setting(
        False, "serve and dial plaintext, with no peer identities (development only; never the default)"
    )
    probe_port: int = setting(
        0,
        "gRPC planes: a plaintext port answering grpc.health.v1 alone, for kubelet's gRPC probes "
        "(which speak no TLS); 0 for none",
    )

    def mesh_security(self, stem: str) -> MeshSecurity:
        """The plane's security: plaintext if ``insecure``, else mTLS with
        its files (``$LLMMESH_HOME/certs/STEM.pem`` unless set)."""
        if not 0 <= self.probe_port <= 65535:
            raise TlsSetupError(f"probe_port must be a port (1 to 65535) or 0 for none: {self.probe_port}")
        if self.insecure:
            log.warning("plaintext gRPC: no certificates, every caller is trusted (--insecure)")
            security = MeshSecurity.insecure()
        else:
            cert = Path(self.tls_cert) if self.tls_cert else mesh_home() / "certs" / f"{stem}.pem"
            key = Path(self.tls_key) if self.tls_key else cert.with_suffix(".key")
            ca = Path(self.tls_ca) if self.tls_ca else cert.with_name("ca.pem")
            security = MeshSecurity.mtls(CertFiles(cert, key, ca))
        security.probe_port = self.probe_port
        return security


@dataclass(frozen=True)
class _Stamp:
    """What a file set looked like when last read."""

    stats: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, files: CertFiles) -> _Stamp:
        stats = []
        for path in (files.cert, files.key, files.ca):
            st = os.stat(path)
            stats.append((st.st_mtime_ns, st.st_size))
        return cls(tuple(stats))


@dataclass
class _Loaded:
    stamp: _Stamp
    cert: bytes
    key: bytes
    ca: bytes


def _read(files: CertFiles) -> _Loaded:
    stamp = _Stamp.of(files)
    return _Loaded(stamp, files.cert.read_bytes(), files.key.read_bytes(), files.ca.read_bytes())


def _pair_matches(cert: bytes, key: bytes) -> bool:
    leaf = x509.load_pem_x509_certificate(cert).public_key()
    private = serialization.load_pem_private_key(key, password=None)
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    return leaf.public_bytes(enc, fmt) == private.public_key().public_bytes(enc, fmt)


@dataclass
class MeshSecurity:
    """How one plane serves and dials: mTLS with ``files``, or plaintext (``files`` None)."""

    files: CertFiles | None
    identity: PlaneIdentity | None = None
    _loaded: _Loaded | None = field(default=None, repr=False)
    # A plaintext port that answers grpc.health.v1 alone (0: none), since
    # kubelet's gRPC probe cannot speak TLS; it tells nothing but up or down.
    probe_port: int = 0

    @classmethod
    def insecure(cls) -> MeshSecurity:
        return cls(None)

    @classmethod
    def mtls(cls, files: CertFiles) -> MeshSecurity:
        """mTLS with ``files``; TlsSetupError if they are missing or name no identity."""
        if not files.exist():
            missing = ", ".join(str(p) for p in (files.cert, files.key, files.ca) if not p.is_file())
            raise TlsSetupError(
                f"no mesh certificate: {missing} missing; issue one with `llmmesh certs issue` "
                "(`llmmesh up` does it on first start), or pass --insecure for plaintext"
            )
        loaded = _read(files)
        if not _pair_matches(loaded.cert, loaded.key):
            raise TlsSetupError(f"{files.key} is not the key of {files.cert}")
        identity = identity_of_pem(loaded.cert)
        if identity is None:
            raise TlsSetupError(f"{files.cert} names no llmmesh identity (spiffe://llmmesh/... URI SAN)")
        return cls(files, identity, loaded)

    @property
    def enabled(self) -> bool:
        return self.files is not None

    def expect_role(self, role: Role) -> PlaneIdentity | None:
        """This plane's identity, checked to be of ``role`` (None when plaintext)."""
        if self.identity is not None and self.identity.role is not role:
            assert self.files is not None
            raise TlsSetupError(f"{self.files.cert} names {self.identity}, not a {role} identity")
        return self.identity

    def _current(self) -> _Loaded:
        """The files as they are now, or as last read while a rotation is half written."""
        assert self.files is not None and self._loaded is not None
        try:
            stamp = _Stamp.of(self.files)
            if stamp != self._loaded.stamp:
                fresh = _read(self.files)
                if _pair_matches(fresh.cert, fresh.key):
                    identity = identity_of_pem(fresh.cert)
                    if identity is not None:
                        if identity != self.identity:
                            log.warning("certificate %s now names %s", self.files.cert, identity)
                        self._loaded, self.identity = fresh, identity
                        log.info("reloaded mesh certificate %s", self.files.cert)
        except (OSError, ValueError) as err:
            log.warning("keeping the mesh certificate in use: cannot reload %s: %s", self.files.cert, err)
        return self._loaded

    def current_stamp(self) -> object:
        """What the certificate files look like now (as last read while a
        rotation is half written): a new value after each rotation."""
        return self._current().stamp

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials that require a client certificate from the mesh CA
        and pick up a rotated certificate on the next connection."""
        loaded = self._current()

        def config(item: _Loaded) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(item.key, item.cert)], root_certificates=item.ca
            )

        served = [loaded.stamp]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            now = self._current()
            if now.stamp == served[0]:
                return None
            served[0] = now.stamp
            return config(now)

        return grpc.dynamic_ssl_server_credentials(config(loaded), fetch, require_client_authentication=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        loaded = self._current()
        return grpc.ssl_channel_credentials(loaded.ca, loaded.key, loaded.cert)


def open_secure_channel(
    address: str, security: MeshSecurity, server_name: str, options: Sequence[tuple[str, int | str]]
) -> grpc.aio.Channel:
    """A channel to ``address`` that expects the server to answer to
    ``server_name`` (see :func:`llmmesh.core.identity.role_name`), presenting
    this plane's certificate as it is when each call starts
    (:class:`~llmmesh.renewing_channel.RenewingChannel`)."""
    interceptors = client_interceptors() or None
    if not security.enabled:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    named = [*options, ("grpc.ssl_target_name_override", server_name)]
    return RenewingChannel(
        lambda: grpc.aio.secure_channel(
            address, security.channel_credentials(), options=named, interceptors=interceptors
        ),
        security.current_stamp,
    )


def holder_security(stem: str, *, insecure: bool = False, directory: Path | None = None) -> MeshSecurity:
    """The security of a command-line tool holding certificate ``STEM``
    (``admin``, ``client``) in ``directory`` (default
    ``$LLMMESH_HOME/certs``): plaintext when ``insecure``."""
    if insecure:
        return MeshSecurity.insecure()
    base = directory or mesh_home() / "certs"
    return MeshSecurity.mtls(CertFiles(base / f"{stem}.pem", base / f"{stem}.key", base / "ca.pem"))


@lru_cache(maxsize=1024)
def parse_peer(uri: bytes) -> PlaneIdentity | None:
    try:
        return PlaneIdentity.parse(uri.decode())
    except (IdentityError, UnicodeDecodeError):
        return None


def peer_identity(context: grpc.aio.ServicerContext) -> PlaneIdentity | None:
    """The mesh identity the calling peer's certificate names, if any."""
    ids = context.auth_context().get("peer_spiffe_id")
    return parse_peer(ids[0]) if ids else None
