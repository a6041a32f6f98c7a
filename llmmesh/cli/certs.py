"""``llmmesh certs``: the mesh CA and the planes' certificates.

``init`` creates the CA (in ``--ca-dir``, default ``ca`` beside the
certificate directory ``--dir``, itself default ``$LLMMESH_HOME/certs``;
the key never lies in the planes' directory, and a key found there, the
older layout, is moved out); ``issue`` writes one holder's certificate and
key; ``rotate`` re-issues every certificate of the directory under the
same identities (running planes pick the new files up on their next
connection, with no restart); ``rotate-ca`` starts a CA rotation: a new
CA trusted beside the old one in ``ca.pem``, then, once the planes have
re-read it (``--settle-s``), every certificate re-issued from the new CA;
``retire-ca`` ends it, dropping every CA but the current one from
``ca.pem``; ``list`` shows each holder and when its certificate expires.
``llmmesh up`` lays its planes' certificates with
:func:`llmmesh.topology.mesh_certs.ensure_mesh_certs`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cryptography import x509

from llmmesh.core.certs import LEAF_DAYS, CertificateAuthority, identity_of_pem, move_ca_key, not_after
from llmmesh.core.identity import IdentityError, PlaneIdentity, Role
from llmmesh.topology.mesh_certs import (
    ca_dir,
    certs_dir,
    leaf_files,
    retire_old_cas,
    rotate_all,
    trust_new_ca,
)

SETTLE_S = 3.0
"""How long ``rotate-ca`` waits between trusting the new CA and issuing
from it: planes re-read their files at most once a second."""


def _identity_of_args(args: argparse.Namespace) -> PlaneIdentity:
    role = Role(args.role)
    name = args.name or (args.region if role in (Role.REGION,) else role.value)
    return PlaneIdentity(role, name, args.zone or "", args.region or "")


def _subject(cert: x509.Certificate) -> str:
    return cert.subject.rfc4514_string()


def _list(directory: Path, as_json: bool) -> None:
    rows = []
    for path in leaf_files(directory):
        pem = path.read_bytes()
        named = identity_of_pem(pem)
        rows.append(
            {
                "file": str(path),
                "identity": named.uri if named else "",
                "not_after": not_after(pem).isoformat(),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['identity']:<60} expires {row['not_after']}  {row['file']}")


def run_certs(args: argparse.Namespace) -> int:
    directory = certs_dir(args.dir)
    keys = ca_dir(args.ca_dir, directory)
    try:
        if move_ca_key(directory, keys):
            print(f"moved the CA key out of {directory} into {keys}: planes never read it there again")
        if args.certs_action == "init":
            ca = CertificateAuthority.open(directory, ca_dir=keys)
            print(f"mesh CA in {keys} (trust bundle {directory / 'ca.pem'}), subject {_subject(ca.cert)}")
        elif args.certs_action == "issue":
            identity = _identity_of_args(args)
            ca = CertificateAuthority.open(directory, ca_dir=keys)
            files = ca.issue(identity, hosts=tuple(args.host or ()), days=args.days)
            print(f"issued {identity.uri}: {files.cert} (key {files.key}), valid {args.days} days")
        elif args.certs_action == "rotate":
            rotated = rotate_all(directory, keys)
            for identity in rotated:
                print(f"rotated {identity.uri}")
            print(f"{len(rotated)} certificates re-issued in {directory}")
        elif args.certs_action == "rotate-ca":
            change = trust_new_ca(directory, keys)
            bundle = directory / "ca.pem"
            print(f"new CA {_subject(change.ca)} in {keys}; {bundle} trusts {len(change.trusted)} CAs")
            time.sleep(args.settle_s)
            rotated = rotate_all(directory, keys)
            print(f"{len(rotated)} certificates re-issued from the new CA in {directory}")
            print(
                "both CAs stay trusted until `llmmesh certs retire-ca`: run it once every holder "
                "outside this directory has a certificate of the new CA"
            )
        elif args.certs_action == "retire-ca":
            retired = retire_old_cas(directory, keys)
            for cert in retired:
                print(f"retired {_subject(cert)}")
            print(f"{directory / 'ca.pem'} trusts the current CA alone" if retired else "no CA to retire")
        else:
            _list(directory, args.json)
    except (IdentityError, ValueError, OSError) as err:
        print(f"llmmesh certs: {err}", file=sys.stderr)
        return 2
    return 0


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value


def add_certs_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=None, help="certificate directory (default $LLMMESH_HOME/certs)")
    common.add_argument(
        "--ca-dir", default=None, help="the CA's key and certificate (default: ca beside --dir)"
    )
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
    rotate_ca = actions.add_parser(
        "rotate-ca",
        parents=[common],
        help="a new CA trusted beside the old, every certificate re-issued from it",
    )
    rotate_ca.add_argument(
        "--settle-s",
        type=_seconds,
        default=SETTLE_S,
        help=f"wait between trusting the new CA and issuing from it ({SETTLE_S:g})",
    )
    actions.add_parser("retire-ca", parents=[common], help="drop every CA but the current one from ca.pem")
    listing = actions.add_parser("list", parents=[common], help="the certificates and their expiry")
    listing.add_argument("--json", action="store_true", help="print JSON")
