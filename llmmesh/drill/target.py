"""Where the mesh under drill is: its edge, its global plane, the API keys
the traffic uses and, for a mesh ``llmmesh up`` runs, its processes.

An embedded mesh is found through ``$LLMMESH_HOME/mesh.json``: the edge,
the global plane, the dev key of every zone, every region's zone and pods,
and the pid of every process the mesh started (only those are ever
signalled, see :mod:`llmmesh.drill.disruption`). A deployed mesh is named
by ``--edge-url``, ``--api-key`` and ``--global-address``; the drill learns
its region directory and the key's tenant from the global plane.

The drill's gRPC calls (the global plane, the pods' tokenizers) present the
mesh's ``admin`` certificate over mutual TLS, from ``--certs-dir``, else the
mesh file's ``tls`` entry, else ``$LLMMESH_HOME/certs``; plaintext only with
``--insecure`` or a mesh file that says the mesh runs so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from llmmesh.client import CertificateSetupError, MeshTls
from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.core.mtls import MeshSecurity
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import geo_routing_service_pb2_grpc, policy_service_pb2_grpc
from llmmesh.v1 import policy_service_pb2 as ppb

CALL_TIMEOUT_S = 10.0
Dial = Callable[[], grpc.aio.Channel]
"""Opens a new channel to one plane."""


class TargetError(Exception):
    """The mesh cannot be found or does not have what the drill needs; the message says what."""


@dataclass(frozen=True)
class PodRef:
    """An engine pod of a region."""

    pod_id: str
    address: str


@dataclass(frozen=True)
class TenantKey:
    """An API key of the traffic and the tenant it belongs to."""

    secret: str
    tenant_id: str
    zone: str


@dataclass(frozen=True)
class MeshTarget:
    """The mesh a drill runs against."""

    edge_url: str
    global_address: str
    secrets: Mapping[str, str]
    """API keys by zone (``llmmesh up``'s dev keys); a deployed mesh's one key under ``""``."""
    primary_secret: str
    """The key used where one zone's tenant will do."""
    security: MeshSecurity
    """How the drill reaches the planes: the admin certificate, or plaintext."""
    tls: MeshTls = field(default_factory=MeshTls)
    """Where that came from; its directory holds the planes' certificates too (``llmmesh up``)."""
    mesh_file: Path | None = None
    """The ``mesh.json`` naming the processes the drill may signal; None for a deployed mesh."""
    region_zones: Mapping[str, str] = field(default_factory=dict)
    """Every region's zone, as the mesh file says; the global plane's directory fills in the rest."""
    pods: Mapping[str, tuple[PodRef, ...]] = field(default_factory=dict)
    """Every region's engine pods, as the mesh file says."""
    region_addresses: Mapping[str, str] = field(default_factory=dict)
    """Every region's ChatService address, as the mesh file says."""

    @property
    def embedded(self) -> bool:
        return self.mesh_file is not None

    def secret_for_zone(self, zone: str) -> str | None:
        """The key of ``zone``'s tenant, when the target has one."""
        return self.secrets.get(zone)

    def global_channel(self) -> grpc.aio.Channel:
        return open_channel(self.global_address, self.security, role_name(Role.GLOBAL))

    def pod_dial(self, address: str, zone: str, region: str) -> Dial:
        """Opens channels to the pod at ``address`` of ``region``, which must answer as one of its pods."""
        name = role_name(Role.ENGINE, zone, region) if zone and region else role_name(Role.ENGINE)
        return lambda: open_channel(address, self.security, name)


def read_target(
    mesh_file: Path,
    *,
    edge_url: str | None = None,
    api_key: str | None = None,
    global_address: str | None = None,
    insecure: bool = False,
    certs_dir: str | None = None,
) -> MeshTarget:
    """The target the flags name, completed from ``mesh_file``.

    With ``edge_url`` the mesh counts as deployed (no process of it is
    signalled) and ``api_key`` and ``global_address`` must be given or be
    in the mesh file; without it, the mesh file must exist. ``insecure``
    and ``certs_dir`` are the TLS flags (see the module docstring).
    """
    data = _read_mesh_file(mesh_file, required=edge_url is None)
    if edge_url is not None and data.get("edge_url") != edge_url:
        # Another mesh than the one mesh.json describes: none of its processes are ours to signal.
        data = {}
    edge = edge_url or str(data.get("edge_url", ""))
    glob = global_address or str(data.get("global_address", ""))
    keys = data.get("keys") if isinstance(data.get("keys"), dict) else {}
    assert isinstance(keys, dict)
    secrets: dict[str, str] = {str(zone): str(secret) for zone, secret in keys.items()}
    primary = api_key or str(data.get("api_key", ""))
    if api_key is not None:
        secrets = {"": api_key}
    missing = [name for name, value in (("--edge-url", edge), ("--global-address", glob)) if not value]
    if not primary:
        missing.append("--api-key")
    if missing:
        raise TargetError(f"no {', '.join(missing)}: give them, or start a mesh with `llmmesh up`")
    region_zones: dict[str, str] = {}
    addresses: dict[str, str] = {}
    pods: dict[str, tuple[PodRef, ...]] = {}
    listed = data.get("regions")
    try:
        for region in listed if isinstance(listed, list) else ():
            name = str(region["region"])
            region_zones[name] = str(region.get("zone", ""))
            if region.get("address"):
                addresses[name] = str(region["address"])
            pods[name] = tuple(PodRef(str(p["pod_id"]), str(p["address"])) for p in region.get("engines", ()))
        tls = MeshTls.from_flags(insecure, certs_dir, MeshTls.from_json(data.get("tls")) if data else None)
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise TargetError(f"cannot read {mesh_file}: {err!r}") from None
    try:
        security = tls.security("admin")
    except CertificateSetupError as err:
        raise TargetError(str(err)) from None
    return MeshTarget(
        edge_url=edge.rstrip("/"),
        global_address=glob,
        secrets=secrets,
        primary_secret=primary,
        security=security,
        tls=tls,
        mesh_file=mesh_file if data.get("pids") else None,
        region_zones=region_zones,
        pods=pods,
        region_addresses=addresses,
    )


def _read_mesh_file(path: Path, *, required: bool) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        if required:
            raise TargetError(
                f"no {path}: start a mesh with `llmmesh up`, or name one with --edge-url, "
                "--api-key and --global-address"
            ) from None
        return {}
    except (OSError, ValueError) as err:
        raise TargetError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise TargetError(f"{path} is not a JSON object")
    return data


async def tenant_of(target: MeshTarget, secret: str) -> TenantKey:
    """The tenant of ``secret`` (its id and zone), from the global plane."""
    async with target.global_channel() as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        try:
            found = await policy.AuthenticateKey(
                ppb.AuthenticateKeyRequest(secret=secret), timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise TargetError(
                f"the global plane does not accept the key: {from_rpc_error(err).message}"
            ) from None
    return TenantKey(secret, str(found.tenant.id), str(found.tenant.zone))


@dataclass(frozen=True)
class ListedRegion:
    """A region as geo-routing lists it."""

    zone: str
    chat_address: str


async def region_directory(target: MeshTarget) -> dict[str, ListedRegion]:
    """Every region geo-routing knows, with its zone and address."""
    async with target.global_channel() as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        try:
            listed = await geo.ListRegions(gpb.ListRegionsRequest(page_size=500), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise TargetError(f"geo-routing does not answer: {from_rpc_error(err).message}") from None
    return {
        str(s.report.region): ListedRegion(str(s.report.zone), str(s.report.chat_address))
        for s in listed.regions
    }


async def first_region(target: MeshTarget, tenant_id: str) -> str:
    """The region geo-routing puts first for the tenant: where its turns go."""
    async with target.global_channel() as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        try:
            routed = await geo.Route(gpb.RouteRequest(tenant_id=tenant_id), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise TargetError(
                f"geo-routing does not route the tenant: {from_rpc_error(err).message}"
            ) from None
    if not routed.regions:
        raise TargetError("geo-routing lists no region for the tenant")
    return str(routed.regions[0].report.region)
