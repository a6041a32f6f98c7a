"""What a drill finds before it starts: the traffic's keys and tenants, the
region directory, the region to disrupt (or how to choose it) and how to
disrupt it.

For the kinds that name a region (``region``, ``pod``, ``partition-global``)
without ``--region``, the region is chosen at the moment of the disruption:
the region of the traffic's zone running most of the turns then in flight
(geo-routing orders a zone's regions by load, so the busy one changes as
the drill runs). Streams whose turns end together start their next ones
together, so there are moments when no turn in flight has been accepted
yet (its region is not known): the choice waits for the first acceptance
then (at most :data:`ACCEPT_WAIT_S`), and only when none comes takes the
region geo-routing puts first, which, ordered by load, is the idler one.
Kind ``pod`` without ``--pod`` disrupts the region's pod running most
generations then (:meth:`DrillSetup.choose_pod`). The traffic uses the
key of that zone (the region's zone when one is named; the primary key's
otherwise). For the other kinds it uses every zone's key in turn.

Kind ``partition-global`` cuts the region's host off from the global
plane's (:class:`~llmmesh.drill.disruption.RouteDisruption`): a mesh of
``llmmesh up --netns``, or a deployed one through ``--disrupt-command``.

Kind ``cert-rotation`` rotates the certificates of the directory the drill
takes its own from (:mod:`llmmesh.drill.rotation`), which for a mesh
``llmmesh up`` runs is where its planes' are, and checks every gRPC server
it knows: the global plane, each region of the directory and each pod of
the mesh file. Kind ``ca-rotation`` rotates the CA of that directory the
same way (:mod:`llmmesh.drill.ca_rotation`); both need the CA's key, kept
in its own directory (``ca`` beside the certificates unless the command
line names another).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc.aio

from llmmesh.core.certs import CA_CERT, CA_KEY, default_ca_dir
from llmmesh.core.identity import Role, role_name
from llmmesh.drill.ca_rotation import CaRotation, CaSteps
from llmmesh.drill.disruption import (
    CommandDisruption,
    Disruption,
    DisruptionError,
    LinkDisruption,
    ProcessDisruption,
    RouteDisruption,
)
from llmmesh.drill.plan import ROTATION_KINDS, DrillPlan
from llmmesh.drill.rotation import CertRotation, Rotate, TlsServer
from llmmesh.drill.sse_turn import TurnRecord
from llmmesh.drill.target import (
    Dial,
    ListedRegion,
    MeshTarget,
    PodRef,
    TenantKey,
    first_region,
    region_directory,
    tenant_of,
)
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

ACCEPT_WAIT_S = 10.0
"""How long the region's choice waits for a turn in flight to be accepted."""
ACCEPT_POLL_S = 0.02
POD_POLL_S = 0.1


class DrillInputError(Exception):
    """The drill cannot run as asked (an unknown region, no Redis of the mesh's own…)."""


@dataclass(frozen=True)
class DrillSetup:
    """What the drill found before it starts."""

    plan: DrillPlan
    target: MeshTarget
    keys: tuple[TenantKey, ...]
    region_zones: Mapping[str, str]
    region: str = ""
    """The region asked for; empty to choose it at the disruption (the kinds that name one)."""
    disrupt_command: str = ""
    restore_command: str = ""
    tls_servers: tuple[TlsServer, ...] = ()
    """The servers whose certificates a cert-rotation drill checks."""
    rotate: Rotate | None = None
    """How a cert-rotation drill re-issues the certificates of a directory."""
    ca_steps: CaSteps | None = None
    """How a ca-rotation drill rotates the CA (and where the CA is kept, for both rotations)."""

    @property
    def watched(self) -> TenantKey:
        """The tenant whose routing the drill samples."""
        return self.keys[0]

    def zone_regions(self) -> list[str]:
        """The regions of the traffic's zone."""
        return sorted(r for r, zone in self.region_zones.items() if zone == self.watched.zone)

    async def choose_region(
        self, in_flight: Callable[[], Iterable[TurnRecord]], wait_s: float = ACCEPT_WAIT_S
    ) -> str:
        """The region to disrupt now (see the module docstring): ``in_flight``
        gives the turns in flight at each look; empty for kinds that name none."""
        if not self.plan.names_region or self.region:
            return self.region
        ours = set(self.zone_regions())
        deadline = time.monotonic() + wait_s
        while True:
            busy = Counter(r.region for r in in_flight() if r.region in ours).most_common(1)
            if busy:
                return busy[0][0]
            if time.monotonic() >= deadline:
                return await first_region(self.target, self.watched.tenant_id)
            await asyncio.sleep(ACCEPT_POLL_S)

    async def choose_pod(self, region: str, wait_s: float = ACCEPT_WAIT_S) -> str:
        """For kind ``pod``, the pod of ``region`` to disrupt now: ``--pod``,
        else the one running (and queueing) most generations, by each pod's
        own ``GetLoad``, so the disruption reaches turns in flight; empty for
        the other kinds. While every pod that answers is idle (streams between
        turns, as for the region's choice) it asks again, for at most
        ``wait_s``; then the busiest that answered, else the region's first."""
        if self.plan.kind != "pod" or self.plan.pod:
            return self.plan.pod
        deadline = time.monotonic() + wait_s
        while True:
            loads = await self.pod_loads(region)
            busiest = max(loads, key=loads.__getitem__, default="")
            if busiest and loads[busiest] > 0:
                return busiest
            if time.monotonic() >= deadline:
                refs = self.target.pods.get(region, ())
                return busiest or (refs[0].pod_id if refs else "")
            await asyncio.sleep(POD_POLL_S)

    async def pod_loads(self, region: str) -> dict[str, int]:
        """The generations each pod of ``region`` runs and queues, by pod id
        (a pod that does not answer is left out)."""

        async def load_of(ref: PodRef) -> int | None:
            try:
                async with self.target.pod_dial(
                    ref.address, self.region_zones.get(region, ""), region
                )() as ch:
                    load = await engine_service_pb2_grpc.EngineServiceStub(ch).GetLoad(
                        engine_service_pb2.GetLoadRequest(), timeout=2.0
                    )
            except grpc.aio.AioRpcError:
                return None
            return int(load.report.running + load.report.waiting)

        refs = self.target.pods.get(region, ())
        answers = await asyncio.gather(*(load_of(ref) for ref in refs))
        return {ref.pod_id: busy for ref, busy in zip(refs, answers, strict=True) if busy is not None}

    def plane_of(self, region: str, pod: str = "") -> str:
        """The name ``mesh.json``'s pids give the process to disrupt (``pod``: the pod chosen, kind pod)."""
        plan, pods = self.plan, [p.pod_id for p in self.target.pods.get(region, ())]
        if plan.kind in ("region", "partition-global"):
            return region
        if plan.kind == "pod":
            chosen = pod or plan.pod
            if chosen and pods and chosen not in pods:
                raise DrillInputError(f"region {region} has no pod {chosen!r} (pods: {', '.join(pods)})")
            if not chosen and not pods:
                raise DrillInputError(f"no pod of region {region} is known: name one with --pod")
            return chosen or pods[0]
        return "global" if plan.kind == "global-plane" else "redis"

    def disruption_for(self, region: str, pod: str = "") -> Disruption:
        """How to disrupt the kind's part (of ``region``; ``pod``, the pod
        chosen for kind pod); DrillInputError when it cannot be."""
        if self.plan.kind in ROTATION_KINDS:
            return self._rotation()
        if self.disrupt_command:
            return CommandDisruption(self.disrupt_command, self.restore_command)
        if self.target.mesh_file is None:
            raise DrillInputError("a deployed mesh is disrupted by --disrupt-command (and --restore-command)")
        try:
            if self.plan.mode == "link-down":
                return LinkDisruption(self.target.mesh_file, self.plane_of(region, pod))
            if self.plan.kind == "partition-global":
                return RouteDisruption(self.target.mesh_file, self.plane_of(region), "global")
            return ProcessDisruption(
                self.target.mesh_file, self.plane_of(region, pod), self.plan.mode, self.plan.poll_interval_s
            )
        except DisruptionError as err:
            if self.plan.kind == "redis":
                raise DrillInputError(
                    "this mesh runs no Redis of its own: start it with `llmmesh up --redis embedded`"
                ) from err
            raise DrillInputError(str(err)) from err

    def _rotation(self) -> CertRotation:
        directory, files = self.target.tls.directory, self.target.security.files
        kind = self.plan.kind
        if directory is None or files is None:
            raise DrillInputError("this mesh runs plaintext (--insecure): it has no certificates to rotate")
        if self.disrupt_command:
            raise DrillInputError(f"--kind {kind} rotates certificates itself: drop --disrupt-command")
        keys = self.ca_steps.ca_dir if self.ca_steps is not None else default_ca_dir(directory)
        if not ((keys / CA_KEY).is_file() and (keys / CA_CERT).is_file()):
            raise DrillInputError(
                f"{directory} holds no mesh CA ({keys} has no {CA_KEY}, {CA_CERT}): rotate where the "
                "certificates are issued, and name that directory with --certs-dir (the CA's with --ca-dir)"
            )
        plan = self.plan
        if kind == "ca-rotation":
            if self.ca_steps is None:
                raise DrillInputError("this drill was given no way to rotate the CA")
            every_s = plan.rotate_every_s
            return CaRotation(self.ca_steps, directory, self.tls_servers, every_s=every_s, admin=files)
        if self.rotate is None:
            raise DrillInputError("this drill was given no way to rotate certificates")
        return CertRotation(
            self.rotate,
            directory,
            self.tls_servers,
            rounds=plan.rotations,
            every_s=plan.rotate_every_s,
            admin=files,
        )

    def tokenizer_pods(self, region: str, pod: str = "") -> list[Dial]:
        """Pods to tokenize on: those the disruption left alone first."""
        plane = self.plane_of(region, pod) if self.plan.names_region else ""
        pods = [(r, p) for r, found in self.target.pods.items() for p in found]
        spared = [(r, p) for r, p in pods if r != region and p.pod_id != plane]
        ordered = spared + [(r, p) for r, p in pods if (r, p) not in spared]
        return [self.target.pod_dial(p.address, self.region_zones.get(r, ""), r) for r, p in ordered]


def tls_servers(target: MeshTarget, directory: dict[str, ListedRegion]) -> tuple[TlsServer, ...]:
    """Every gRPC server of the mesh the drill knows: the global plane, the
    regions (at the mesh file's address, else geo-routing's) and the mesh file's pods."""
    servers = [TlsServer("global", target.global_address, role_name(Role.GLOBAL))]
    zones = {**target.region_zones, **{r: listed.zone for r, listed in directory.items()}}
    for region in sorted(set(target.region_addresses) | set(directory)):
        address = target.region_addresses.get(region) or directory[region].chat_address
        name = role_name(Role.REGION, zones[region], region)
        servers.append(TlsServer(f"region {region}", address, name))
    for region, pods in sorted(target.pods.items()):
        name = role_name(Role.ENGINE, zones.get(region, ""), region)
        servers += [TlsServer(f"pod {pod.pod_id}", pod.address, name) for pod in pods]
    return tuple(servers)


async def prepare(
    plan: DrillPlan,
    target: MeshTarget,
    disrupt_command: str = "",
    restore_command: str = "",
    rotate: Rotate | None = None,
    ca_steps: CaSteps | None = None,
) -> DrillSetup:
    """Resolve the plan against the mesh, checking that the disruption can
    be made; DrillInputError or TargetError when the drill cannot run.
    ``rotate`` re-issues a directory's certificates (kind cert-rotation),
    ``ca_steps`` rotate its CA (kind ca-rotation)."""
    primary = await tenant_of(target, target.primary_secret)
    directory = await region_directory(target)
    zones = {**target.region_zones, **{region: listed.zone for region, listed in directory.items()}}
    if not plan.names_region:
        others = [s for s in target.secrets.values() if s != primary.secret]
        keys = (primary, *[await tenant_of(target, s) for s in others])
        servers = tls_servers(target, directory) if plan.kind in ROTATION_KINDS else ()
        setup = DrillSetup(
            plan,
            target,
            keys,
            zones,
            disrupt_command=disrupt_command,
            restore_command=restore_command,
            tls_servers=servers,
            rotate=rotate,
            ca_steps=ca_steps,
        )
        setup.disruption_for("")
        return setup
    if plan.region and plan.region not in zones:
        raise DrillInputError(
            f"geo-routing knows no region {plan.region!r} (regions: {', '.join(sorted(zones))})"
        )
    zone = zones[plan.region] if plan.region else primary.zone
    secret = target.secret_for_zone(zone) or target.primary_secret
    key = primary if secret == primary.secret else await tenant_of(target, secret)
    if key.zone != zone:
        raise DrillInputError(
            f"region {plan.region} is in zone {zone}, the key's tenant in zone {key.zone}: "
            "traffic would never reach it"
        )
    setup = DrillSetup(plan, target, (key,), zones, plan.region, disrupt_command, restore_command)
    # Fail now, not after the steady phase, when the part cannot be disrupted.
    for region in [plan.region] if plan.region else setup.zone_regions():
        setup.disruption_for(region)
    return setup
