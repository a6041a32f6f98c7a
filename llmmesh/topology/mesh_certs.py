"""A mesh's certificate directory: the CA (kept apart, in its own
directory) and one certificate per plane identity, issued when missing,
near expiry or from a CA the mesh no longer issues with, and rotated
together; and the CA's own rotation. ``llmmesh up``, ``llmmesh certs`` and
the benches lay their planes' certificates with :func:`ensure_mesh_certs`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from llmmesh.core.certs import (
    BUNDLE,
    CA_CERT,
    CaLayoutError,
    CertFiles,
    CertificateAuthority,
    default_ca_dir,
    identity_of_pem,
    issued_by,
    not_after,
    read_bundle,
)
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import PlaneIdentity

RENEW_BEFORE = dt.timedelta(days=7)
"""A certificate that expires sooner than this is re-issued by :func:`ensure_mesh_certs`."""


def certs_dir(given: str | Path | None = None) -> Path:
    return Path(given) if given else mesh_home() / "certs"


def ca_dir(given: str | Path | None = None, certs: Path | None = None) -> Path:
    """The CA's directory: ``given``, else ``ca`` beside ``certs`` (default ``$LLMMESH_HOME/ca``)."""
    return Path(given) if given else default_ca_dir(certs or certs_dir())


def leaf_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.pem") if p.name not in (BUNDLE, CA_CERT))


def _needs_issue(files: CertFiles, identity: PlaneIdentity, ca: x509.Certificate) -> bool:
    if not files.exist():
        return True
    pem = files.cert.read_bytes()
    try:
        named = identity_of_pem(pem)
    except ValueError:
        return True
    expiring = not_after(pem) - dt.datetime.now(dt.UTC) < RENEW_BEFORE
    return named != identity or expiring or not issued_by(pem, ca)


def ensure_mesh_certs(
    directory: Path, identities: Iterable[PlaneIdentity], ca: Path | None = None
) -> dict[str, CertFiles]:
    """Create the CA (in ``ca``, default :func:`ca_dir`) if there is none
    and issue each identity's certificate that is missing, names another
    identity, expires within a week or was issued by another CA; the files
    by stem."""
    authority = CertificateAuthority.open(directory, ca_dir=ca)
    files: dict[str, CertFiles] = {}
    for identity in identities:
        held = authority.files_of(identity)
        if _needs_issue(held, identity, authority.cert):
            held = authority.issue(identity)
        files[held.cert.stem] = held
    return files


def rotate_all(directory: Path, ca: Path | None = None) -> list[PlaneIdentity]:
    """Re-issue every certificate in ``directory`` under its identity, from
    the CA of ``ca``; the identities rotated."""
    return _reissue(CertificateAuthority.open(directory, ca_dir=ca))


def _reissue(authority: CertificateAuthority) -> list[PlaneIdentity]:
    rotated = []
    for path in leaf_files(authority.directory):
        identity = identity_of_pem(path.read_bytes())
        if identity is not None:
            authority.issue(identity)
            rotated.append(identity)
    return rotated


@dataclass(frozen=True)
class CaChange:
    """What a step of a CA rotation did."""

    ca: x509.Certificate
    """The CA that issues from now on."""
    trusted: list[x509.Certificate]
    """Every CA the bundle holds now."""


def trust_new_ca(directory: Path, ca: Path | None = None) -> CaChange:
    """The first step of a CA rotation: a new CA in ``ca``, trusted beside
    the old one in ``directory``'s bundle; nothing issued from it yet."""
    new = CertificateAuthority.open(directory, ca_dir=ca).begin_rotation()
    return CaChange(new.cert, read_bundle(directory / BUNDLE))


def stale_leaves(authority: CertificateAuthority) -> list[Path]:
    """The certificates of the planes' directory that ``authority`` did not issue."""
    return [p for p in leaf_files(authority.directory) if not issued_by(p.read_bytes(), authority.cert)]


def retire_old_cas(directory: Path, ca: Path | None = None) -> list[x509.Certificate]:
    """The last step of a CA rotation: every CA but the current one out of
    ``directory``'s bundle; the CAs retired. CaLayoutError, and nothing
    retired, while a certificate of the directory is still an old CA's."""
    authority = CertificateAuthority.open(directory, ca_dir=ca)
    stale = stale_leaves(authority)
    if stale:
        names = ", ".join(p.name for p in stale)
        raise CaLayoutError(
            f"{names} not issued by the current CA: re-issue them first (`llmmesh certs rotate`), "
            "or their holders are refused"
        )
    return authority.retire_others()
