"""How a benchmark's planes talk to each other: plaintext, asked for
explicitly with ``--insecure`` (the planes' default is mutual TLS), or
mTLS with certificates a benchmark issues for its own mesh into a
certificate directory of its run (a CA of its own, thrown away with it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llmmesh.core.certs import CertFiles
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.core.mtls import MeshSecurity, holder_security
from llmmesh.topology.mesh_certs import ensure_mesh_certs

ADMIN = "admin"


def issue_certs(directory: Path, zone: str, region: str, pod_ids: Iterable[str]) -> Path:
    """A CA (in ``ca`` beside ``directory``) and, in ``directory``, a certificate for each plane of a mesh
    with one region (``region`` of ``zone``) over pods ``pod_ids``: the
    global plane, the edge, the region (which a benchmark client that drives
    a pod itself presents too), each pod, and an operator (``admin``).
    Returns ``directory``."""
    identities = [PlaneIdentity(role, role.value) for role in (Role.GLOBAL, Role.EDGE, Role.ADMIN)]
    identities.append(PlaneIdentity(Role.REGION, region, zone, region))
    identities += [PlaneIdentity(Role.ENGINE, pod_id, zone, region) for pod_id in pod_ids]
    ensure_mesh_certs(directory, identities)
    return directory


def plane_tls_flags(certs: Path | None, stem: str) -> list[str]:
    """A plane's flags: ``--insecure`` when ``certs`` is None, else its
    certificate ``STEM.pem`` (``global``, ``edge``, ``region-REGION``,
    ``engine-POD``), key and the CA bundle in ``certs``."""
    if certs is None:
        return ["--insecure"]
    files = CertFiles(certs / f"{stem}.pem", certs / f"{stem}.key", certs / "ca.pem")
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]


def pod_client_security(certs: Path | None, region: str) -> MeshSecurity:
    """What a benchmark client that drives a pod itself presents: the
    benchmark mesh's own ``region`` certificate in ``certs`` (a pod
    generates only for its region; the benchmark's CA and mesh are its own,
    thrown away with the run), or plaintext when ``certs`` is None."""
    return holder_security(f"region-{region}", insecure=certs is None, directory=certs)


def pod_server_name(zone: str, region: str) -> str:
    """The name a pod of ``region`` (in ``zone``) answers to."""
    return role_name(Role.ENGINE, zone, region)
