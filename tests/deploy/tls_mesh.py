"""An mTLS mesh behind a TLS front proxy, for the Envoy tests.

Three CAs in a temporary directory: the mesh CA (every plane's certificate,
and Envoy's ``client`` identity toward the regions), a public CA (the
certificate Envoy serves for ``localhost``, the only one its callers trust)
and a customers' CA (client certificates the gRPC listener asks for). The
global plane, zone ``us`` (us-east and us-west, a pod each) and an edge
serving HTTPS with its mesh certificate run in this process on mTLS.
"""

from __future__ import annotations

import shutil
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from llmmesh.core.certs import CertFiles, CertificateAuthority
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity
from llmmesh.edge.server import EdgeServer
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.region.server import RegionPlane
from llmmesh.topology.envoy_tls import PROXY_IDENTITY, SERVER_STEM, ProxyTls
from tests.security.mesh_pki import EDGE, GLOBAL, POD, US_EAST, US_WEST, Pki, make_pki
from tests.stack import MeshBuilder, region_settings

PUBLIC_NAME = "localhost"
WEST_POD = PlaneIdentity(Role.ENGINE, "us-west-pod-0", "us", "us-west")
CUSTOMER = PlaneIdentity(Role.CLIENT, "acme")


@dataclass
class Certificates:
    """The three CAs and what each issued."""

    mesh: Pki
    public_ca: Path
    customer: CertFiles

    def proxy_tls(self) -> ProxyTls:
        """Envoy's certificates, in the documented layout of the mesh's directory."""
        return ProxyTls.in_directory(self.mesh.ca.directory, client_ca=str(self.customer.ca))

    def https_client(self) -> ssl.SSLContext:
        """What a caller of the HTTP listener trusts: the public CA only."""
        return ssl.create_default_context(cafile=self.public_ca)

    def grpc_channel(self, address: str, *, client_cert: bool = True) -> grpc.aio.Channel:
        """A caller of the gRPC listener, with its customer certificate or with none."""
        if client_cert:
            files = CertFiles(self.customer.cert, self.customer.key, self.public_ca)
            return open_channel(address, MeshSecurity.mtls(files), PUBLIC_NAME)
        credentials = grpc.ssl_channel_credentials(root_certificates=self.public_ca.read_bytes())
        options = [("grpc.ssl_target_name_override", PUBLIC_NAME)]
        return grpc.aio.secure_channel(address, credentials, options=options)


def issue_certificates(root: Path) -> Certificates:
    mesh = make_pki(root)
    for identity in (GLOBAL, EDGE, US_EAST, US_WEST, POD, WEST_POD, PROXY_IDENTITY):
        mesh.files(identity)
    # A mesh-style CA stands in for a public one: no plane trusts it, so what it issues holds no mesh role.
    public = CertificateAuthority.open(root / "public", ca_dir=root / "public-ca")
    served = public.issue(PlaneIdentity(Role.EDGE, "front-proxy"), hosts=(PUBLIC_NAME,))
    shutil.copyfile(served.cert, mesh.ca.directory / f"{SERVER_STEM}.pem")
    shutil.copyfile(served.key, mesh.ca.directory / f"{SERVER_STEM}.key")
    customer = CertificateAuthority.open(root / "customers", ca_dir=root / "customers-ca").issue(CUSTOMER)
    return Certificates(mesh, served.ca, customer)


@dataclass
class SecureZone:
    """The running planes: zone ``us`` and an HTTPS edge, on mTLS."""

    certs: Certificates
    global_plane: GlobalPlane
    east: RegionPlane
    west: RegionPlane
    edge: EdgeServer
    builder: MeshBuilder

    async def stop_west(self) -> None:
        await self.builder.stop(self.west)


def _mtls(mesh: Pki, identity: PlaneIdentity) -> dict[str, Any]:
    """A plane's settings for its mesh certificate (and no plaintext)."""
    return {"insecure": False, **mesh.settings(identity)}


@asynccontextmanager
async def secure_zone(root: Path, sim_inter_token_s: float) -> AsyncIterator[SecureZone]:
    certs = issue_certificates(root)
    mesh = certs.mesh
    async with MeshBuilder() as build:
        glob = await build.global_plane(**_mtls(mesh, GLOBAL))
        regions: list[RegionPlane] = []
        for region, pod_id, location in ((US_EAST, POD, "39.0,-77.5"), (US_WEST, WEST_POD, "45.6,-121.2")):
            pod = await build.pod(pod_id.name, sim_inter_token_s=sim_inter_token_s, **_mtls(mesh, pod_id))
            settings = region_settings(
                glob.address,
                [pod],
                region=region.region,
                location=location,
                **_mtls(mesh, region),
            )
            regions.append(await build.region(settings))
        edge_files = mesh.files(EDGE)
        edge = await build.edge(
            glob.address,
            https_cert_file=str(edge_files.cert),
            https_key_file=str(edge_files.key),
            **_mtls(mesh, EDGE),
        )
        yield SecureZone(certs, glob, regions[0], regions[1], edge, build)
