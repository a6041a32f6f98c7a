"""``--insecure`` and ``--certs-dir``: how a command-line tool that talks
gRPC to the planes (``llmmesh admin``, ``chat``, ``drill``) reaches them.

The flags win; what they leave open comes from ``mesh.json``'s ``tls``
entry when the tool found the mesh there, else the default: mutual TLS with
the certificates of ``$LLMMESH_HOME/certs``.
"""

from __future__ import annotations

import argparse

from llmmesh.client import MeshTls


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="talk plaintext gRPC, for a mesh started with --insecure (default: mTLS, or as mesh.json says)",
    )
    parser.add_argument(
        "--certs-dir",
        default="",
        help="directory of the admin and client certificates and ca.pem "
        "(default: mesh.json's, else $LLMMESH_HOME/certs)",
    )


def tls_from_args(args: argparse.Namespace, mesh: MeshTls | None = None) -> MeshTls:
    """The flags' choice, completed from ``mesh`` (the mesh file's entry) when given."""
    return MeshTls.from_flags(args.insecure, args.certs_dir, mesh)
