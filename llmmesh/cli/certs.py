"""``llmmesh certs``: the mesh CA and the planes' certificates.

``init`` creates the CA of a certificate directory (default
``$LLMMESH_HOME/certs``); ``issue`` writes one holder's certificate and key;
``rotate`` re-issues every certificate of the directory under the same
identities (running planes pick the new files up on their next connection,
with no restart); ``list`` shows each holder and when its certificate
expires. ``llmmesh up`` calls :func:`ensure_mesh_certs` for its planes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from llmmesh.certs import LEAF_DAYS, CertFiles, CertificateAuthority, identity_of_pem, not_after
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import IdentityError, PlaneIdentity, Role

RENEW_BEFORE = dt.timedelta(days=7)
"""A certificate that expires sooner than this is re-issued by :func:`ensure_mesh_certs`."""


def certs_dir(given: str | Path | None = None) -> Path:
    return Path(given) if given else mesh_home() / "certs"


def _leaf_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.pem") if p.name not in ("ca.pem", "ca-cert.pem"))


def _needs_issue(files: CertFiles, identity: PlaneIdentity) -> bool:
    if not files.exist():
        return True
    pem = files.cert.read_bytes()
    try:
        named = identity_of_pem(pem)
    except ValueError:
        return True
    return named != identity or not_after(pem) - dt.datetime.now(dt.UTC) < RENEW_BEFORE


def ensure_mesh_certs(directory: Path, identities: Iterable[PlaneIdentity]) -> dict[str, CertFiles]:
    """Create the CA if there is none and issue each identity's certificate
    that is missing, names another identity or expires within a week; the
    files by stem."""
    ca = CertificateAuthority.open(directory)
    files: dict[str, CertFiles] = {}
    for identity in identities:
        held = ca.files_of(identity)
        if _needs_issue(held, identity):
            held = ca.issue(identity)
        files[held.cert.stem] = held
    return files


def rotate_all(directory: Path) -> list[PlaneIdentity]:
    """Re-issue every certificate in ``directory`` under its identity; the identities rotated."""
    ca = CertificateAuthority.open(directory)
    rotated = []
    for path in _leaf_files(directory):
        identity = identity_of_pem(path.read_bytes())
        if identity is not None:
            ca.issue(identity)
            rotated.append(identity)
    return rotated


def _identity_of_args(args: argparse.Namespace) -> PlaneIdentity:
    role = Role(args.role)
    name = args.name or (args.region if role in (Role.REGION,) else role.value)
    return PlaneIdentity(role, name, args.zone or "", args.region or "")


def run_certs(args: argparse.Namespace) -> int:
    directory = certs_dir(args.dir)
    try:
        if args.certs_action == "init":
            ca = CertificateAuthority.open(directory)
            print(f"mesh CA in {directory} (trust bundle {directory / 'ca.pem'}), subject {ca.cert.subject}")
        elif args.certs_action == "issue":
            identity = _identity_of_args(args)
            files = CertificateAuthority.open(directory).issue(
                identity, hosts=tuple(args.host or ()), days=args.days
            )
            print(f"issued {identity.uri}: {files.cert} (key {files.key}), valid {args.days} days")
        elif args.certs_action == "rotate":
            rotated = rotate_all(directory)
            for identity in rotated:
                print(f"rotated {identity.uri}")
            print(f"{len(rotated)} certificates re-issued in {directory}")
        else:
            rows = []
            for path in _leaf_files(directory):
                pem = path.read_bytes()
                named = identity_of_pem(pem)
                rows.append(
                    {
                        "file": str(path),
                        "identity": named.uri if named else "",
                        "not_after": not_after(pem).isoformat(),
                    }
                )
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                for row in rows:
                    print(f"{row['identity']:<60} expires {row['not_after']}  {row['file']}")
    except (IdentityError, ValueError, OSError) as err:
        print(f"llmmesh certs: {err}", file=sys.stderr)
        return 2
    return 0


def add_certs_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=None, help="certificate directory (default $LLMMESH_HOME/certs)")
    actions = parser.add_subparsers(dest="certs_action", required=True, metavar="ACTION")
    actions.add_parser("init", parents=[common], help="create the mesh CA (once; kept if it exists)")
    issue = actions.add_parser("issue", parents=[common], help="issue (or re-issue) one certificate")
    issue.add_argument("role", choices=[r.value for r in Role], help="what the holder acts as")
    issue.add_argument("--name", default="", help="holder name (pod id for an engine; default per role)")
    issue.add_argument("--zone", default="", help="zone of a region or engine")
    issue.add_argument("--region", default="", help="region of a region or engine")
    issue.add_argument("--host", action="append", help="extra DNS name the holder serves as (repeatable)")
    issue.add_argument("--days", type=int, default=LEAF_DAYS, help="validity in days")
    actions.add_parser("rotate", parents=[common], help="re-issue every certificate of the directory")
    listing = actions.add_parser("list", parents=[common], help="the certificates and their expiry")
    listing.add_argument("--json", action="store_true", help="print JSON")
