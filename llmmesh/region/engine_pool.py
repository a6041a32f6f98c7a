"""The region's engine pods: channels, health and what each one is.

Placement is the KV-affinity router's (:mod:`region.placement.router`); ``pick`` is
the plain least-loaded choice for callers without a router (the safety
judge's model calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_session import EngineSession, engine_session
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc

log = logging.getLogger(__name__)

TIMEOUTS_UNTIL_DOWN = 2
"""Health checks in a row that time out before a pod counts as down."""


@dataclass
class EnginePodHandle:
    """One engine pod as the region sees it."""

    address: str
    channel: grpc.aio.Channel
    stub: engine_service_pb2_grpc.EngineServiceStub
    health: health_pb2_grpc.HealthStub
    # The pod's GenerateSession stream, shared by the turns placed on it.
    session: EngineSession
    pod_id: str = ""
    model: str = ""
    healthy: bool = False
    in_flight: int = 0
    # Health checks in a row that timed out while the pod was up.
    timeouts: int = 0
    # time.monotonic() when the pod came back after being down (its health
    # checks failed, or a turn marked it failed); 0 when it never was down.
    returned_s: float = 0.0
    info: engine_service_pb2.GetEngineInfoResponse = field(
        default_factory=engine_service_pb2.GetEngineInfoResponse
    )


class PodView(EnginePodHandle):
    """A pod with another session in front of its own (a disaggregated
    turn's phases, a hedged turn's second pod): every other attribute reads
    and writes the pod's, so the gateway's in-flight count and a failure
    mark land on the pod itself."""

    def __init__(self, pod: EnginePodHandle, session: EngineSession) -> None:
        # Deliberately not the dataclass __init__: the fields are the pod's.
        object.__setattr__(self, "pod", pod)
        object.__setattr__(self, "session", session)

    pod: EnginePodHandle

    def __getattribute__(self, name: str) -> object:
        if name in _VIEWED:
            return getattr(object.__getattribute__(self, "pod"), name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: object) -> None:
        if name in _VIEWED:
            setattr(object.__getattribute__(self, "pod"), name, value)
        else:
            object.__setattr__(self, name, value)


_VIEWED = frozenset({f.name for f in dataclasses.fields(EnginePodHandle)} - {"session"})


class EnginePool:
    """Tracks the pods of a region and picks one per turn."""

    def __init__(
        self,
        addresses: list[str],
        health_interval_s: float = 1.0,
        dial: Callable[[str], grpc.aio.Channel] = open_channel,
    ) -> None:
        """``dial`` opens the channel to a pod (mTLS, expecting an engine
        identity of this region, in a secured region)."""
        self._pods: list[EnginePodHandle] = []
        for address in addresses:
            channel = dial(address)
            stub = engine_service_pb2_grpc.EngineServiceStub(channel)
            self._pods.append(
                EnginePodHandle(
                    address=address,
                    channel=channel,
                    stub=stub,
                    health=health_pb2_grpc.HealthStub(channel),
                    session=engine_session(stub, address),
                )
            )
        self._interval_s = health_interval_s
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def pods(self) -> list[EnginePodHandle]:
        return list(self._pods)

    @property
    def healthy_pods(self) -> list[EnginePodHandle]:
        return [p for p in self._pods if p.healthy]

    @property
    def models(self) -> list[str]:
        return sorted({p.model for p in self._pods if p.model})

    def no_pod_for(self, model: str) -> Unavailable | None:
        """UNAVAILABLE (ENGINE_UNAVAILABLE, with RetryInfo) when no healthy
        pod here serves ``model``; None when one does (or no model is named)."""
        if not model or any(not p.model or p.model == model for p in self.healthy_pods):
            return None
        return Unavailable(
            Reason.ENGINE_UNAVAILABLE,
            f"no healthy engine pod serves model {model!r} in this region",
            retry_after_s=1.0,
        )

    def context_window(self, model: str) -> int:
        """The smallest context window of the known pods serving ``model``
        (0 when none is known yet)."""
        windows = [
            p.info.context_window
            for p in self._pods
            if p.info.context_window and (not model or p.model == model)
        ]
        return min(windows, default=0)

    @property
    def batch_slots(self) -> int:
        """Generations the healthy pods can batch at once."""
        return sum(p.info.max_num_seqs for p in self._pods if p.healthy)

    def on_checked(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every health round (pods may have come or gone)."""
        self._listeners.append(listener)

    async def check(self) -> None:
        """Probe every pod once; learn its identity the first time it answers."""
        await asyncio.gather(*(self._check_pod(p) for p in self._pods))
        for listener in self._listeners:
            listener()

    async def _check_pod(self, pod: EnginePodHandle) -> None:
        # A pod answering for the first time is starting with the region, not returning.
        seen_before = bool(pod.pod_id)
        try:
            resp = await pod.health.Check(
                health_pb2.HealthCheckRequest(service="llmmesh.v1.EngineService"), timeout=2.0
            )
            serving = resp.status == health_pb2.HealthCheckResponse.SERVING
            if serving and (not pod.pod_id or not pod.healthy):
                # First contact, or back from down: it may have restarted
                # with another model, window or instance.
                info = await pod.stub.GetEngineInfo(engine_service_pb2.GetEngineInfoRequest(), timeout=2.0)
                if pod.info.instance_id and info.instance_id != pod.info.instance_id:
                    log.info("engine pod %s (%s) restarted", info.pod_id, pod.address)
                pod.info = info
                pod.pod_id, pod.model = info.pod_id, info.model
        except grpc.aio.AioRpcError as err:
            serving, why = False, err.code().name
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and pod.healthy:
                # A slow answer may be the region's own busy moment: down
                # after TIMEOUTS_UNTIL_DOWN in a row. A refused connection
                # or a pod saying it is not serving counts at once.
                pod.timeouts += 1
                if pod.timeouts < TIMEOUTS_UNTIL_DOWN:
                    return
        else:
            why = "" if serving else "not serving"
        pod.timeouts = 0
        if serving != pod.healthy:
            state = "up" if serving else f"down ({why})"
            log.info("engine pod %s (%s) is %s", pod.pod_id or "?", pod.address, state)
            if serving and seen_before:
                pod.returned_s = time.monotonic()
        pod.healthy = serving

    def pick(self, model: str, exclude: frozenset[str] = frozenset()) -> EnginePodHandle:
        """The healthy pod serving ``model`` with the fewest turns in flight."""
        candidates = [
            p
            for p in self._pods
            if p.healthy and p.address not in exclude and (not model or not p.model or p.model == model)
        ]
        if not candidates:
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE,
                f"no healthy engine pod serves model {model!r} in this region",
                retry_after_s=1.0,
            )
        return min(candidates, key=lambda p: p.in_flight)

    def serves_elsewhere(self, model: str, pod: EnginePodHandle) -> bool:
        """Whether a healthy pod other than ``pod`` serves ``model``."""
        return any(
            p.healthy and p is not pod and (not model or not p.model or p.model == model) for p in self._pods
        )

    def mark_failed(self, pod: EnginePodHandle) -> None:
        """Take a pod out of placement until its next good health check."""
        pod.healthy = False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="engine-health")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        for pod in self._pods:
            await pod.session.close()
            await pod.channel.close()
