"""An mTLS mesh in this process for the trust-boundary tests: a CA in a
temporary directory, a certificate for every holder the tests play (the
planes, and attackers holding certificates of the wrong role or place),
and the global plane, a pod, a region and optionally the edge serving with
them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc.aio

from llmmesh.core.certs import CertFiles, CertificateAuthority
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity
from llmmesh.edge.server import EdgeServer
from llmmesh.engine.server import EnginePod
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.region.server import RegionPlane
from tests.stack import MeshBuilder, region_settings

GLOBAL = PlaneIdentity(Role.GLOBAL, "global")
EDGE = PlaneIdentity(Role.EDGE, "edge")
ADMIN = PlaneIdentity(Role.ADMIN, "admin")
CLIENT = PlaneIdentity(Role.CLIENT, "client")
US_EAST = PlaneIdentity(Role.REGION, "us-east", "us", "us-east")
US_WEST = PlaneIdentity(Role.REGION, "us-west", "us", "us-west")
EU_WEST = PlaneIdentity(Role.REGION, "eu-west", "eu", "eu-west")
POD = PlaneIdentity(Role.ENGINE, "us-east-pod-0", "us", "us-east")


@dataclass
class Pki:
    """The mesh CA and a foreign one (certificates no plane trusts)."""

    ca: CertificateAuthority
    foreign: CertificateAuthority

    def files(self, identity: PlaneIdentity) -> CertFiles:
        held = self.ca.files_of(identity)
        return held if held.exist() else self.ca.issue(identity)

    def security(self, identity: PlaneIdentity) -> MeshSecurity:
        return MeshSecurity.mtls(self.files(identity))

    def settings(self, identity: PlaneIdentity) -> dict[str, object]:
        files = self.files(identity)
        return {"tls_cert": str(files.cert), "tls_key": str(files.key), "tls_ca": str(files.ca)}

    def channel(self, address: str, holder: PlaneIdentity, server_name: str) -> grpc.aio.Channel:
        return open_channel(address, self.security(holder), server_name)

    def foreign_security(self, identity: PlaneIdentity) -> MeshSecurity:
        """``identity``'s certificate from a CA the mesh does not trust
        (with the mesh's CA, to check servers)."""
        issued = self.foreign.issue(identity)
        return MeshSecurity.mtls(CertFiles(issued.cert, issued.key, self.ca.files_of(identity).ca))


def make_pki(root: Path) -> Pki:
    mesh = CertificateAuthority.open(root / "mesh", ca_dir=root / "mesh-ca")
    return Pki(mesh, CertificateAuthority.open(root / "foreign", ca_dir=root / "foreign-ca"))


@dataclass
class SecureStack:
    pki: Pki
    global_plane: GlobalPlane
    engine: EnginePod
    region: RegionPlane
    edge: EdgeServer | None


@asynccontextmanager
async def secure_stack(
    root: Path, *, with_edge: bool = False, **region_overrides: object
) -> AsyncIterator[SecureStack]:
    """The global plane, one pod, region us-east and optionally the edge, all on mTLS."""
    pki = make_pki(root)
    async with MeshBuilder() as build:
        glob = await build.global_plane(insecure=False, **pki.settings(GLOBAL))
        engine = await build.pod(POD.name, insecure=False, **pki.settings(POD))
        region = await build.region(
            region_settings(
                glob.address, [engine], insecure=False, **pki.settings(US_EAST), **region_overrides
            )
        )
        edge = await build.edge(glob.address, insecure=False, **pki.settings(EDGE)) if with_edge else None
        yield SecureStack(pki, glob, engine, region, edge)
