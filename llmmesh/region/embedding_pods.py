"""Which of the region's engine pods embed, and with what model.

A pod that embeds serves ``EmbeddingService`` beside ``EngineService`` on
the same channel; one that does not answers UNIMPLEMENTED. Each healthy pod
is asked once per instance (``GetEmbeddingInfo``, again after a restart) in
the background after every health round of the pool, so a request rarely
waits for discovery: only when no pod known to the region embeds with the
model asked for and some healthy pod has not answered yet (its first
answer was late), :meth:`place` asks those pods before refusing. While a pod
of the region has not answered in its current instance (down since it
started, or its answer late again), a model no answering pod embeds with is
refused UNAVAILABLE with a retry, not INVALID_ARGUMENT: that pod may serve it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
import grpc.aio

from llmmesh.core.errors import InvalidArgument, Reason, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.engine_pool import EnginePodHandle, EnginePool
from llmmesh.v1 import embedding_service_pb2, embedding_service_pb2_grpc

log = logging.getLogger(__name__)

_INFO_TIMEOUT_S = 2.0


@dataclass
class EmbeddingPod:
    """One pod that embeds: its handle in the pool, stub and model."""

    pod: EnginePodHandle
    stub: embedding_service_pb2_grpc.EmbeddingServiceStub
    info: embedding_service_pb2.GetEmbeddingInfoResponse
    # The pod instance the info was read from.
    instance_id: str
    in_flight: int = 0


class EmbeddingPods:
    """The embedding pods of one region, found through its engine pool."""

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool
        # By pod address: the pod's embedding model, or None for a pod that embeds nothing.
        self._known: dict[str, tuple[str, EmbeddingPod | None]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def models(self) -> list[str]:
        """Embedding models some pod of the region serves."""
        return sorted({e.info.model for _, e in self._known.values() if e is not None})

    def pods_by_model(self) -> dict[str, list[EnginePodHandle]]:
        """The pods (up or down) embedding with each embedding model."""
        found: dict[str, list[EnginePodHandle]] = {}
        for _, known in self._known.values():
            if known is not None:
                found.setdefault(known.info.model, []).append(known.pod)
        return found

    def serves(self, model: str) -> bool:
        """Whether any pod of the region (up or down) embeds with ``model``."""
        return model in self.models

    async def refresh(self) -> None:
        """Ask every healthy pod not yet asked in its current instance."""
        await asyncio.gather(*(self._probe(p) for p in self._pool.healthy_pods))

    def refresh_soon(self) -> None:
        """Start :meth:`refresh` in the background unless one is running (a pool listener)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.refresh(), name="embedding-pods")

    async def _probe(self, pod: EnginePodHandle) -> None:
        instance = pod.info.instance_id
        known = self._known.get(pod.address)
        if known is not None and known[0] == instance:
            return
        stub = embedding_service_pb2_grpc.EmbeddingServiceStub(pod.channel)
        try:
            info = await stub.GetEmbeddingInfo(
                embedding_service_pb2.GetEmbeddingInfoRequest(), timeout=_INFO_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._known[pod.address] = (instance, None)
            else:
                log.info("engine pod %s: embedding info unavailable (%s)", pod.pod_id, err.code().name)
            return
        self._known[pod.address] = (instance, EmbeddingPod(pod, stub, info, instance))
        log.info("engine pod %s embeds with %s (%s)", pod.pod_id, info.model, info.backend)

    @property
    def unanswered(self) -> list[EnginePodHandle]:
        """Pods of the pool (up or down) whose current instance has not told what it embeds."""
        return [
            p
            for p in self._pool.pods
            if (known := self._known.get(p.address)) is None or known[0] != p.info.instance_id
        ]

    async def place(self, model: str, exclude: frozenset[str] = frozenset()) -> EmbeddingPod:
        """:meth:`choose`, after asking the healthy pods not yet asked when
        no pod known here embeds with ``model``."""
        if not self.serves(model) and (unasked := [p for p in self.unanswered if p.healthy]):
            await asyncio.gather(*(self._probe(p) for p in unasked))
        return self.choose(model, exclude)

    def choose(self, model: str, exclude: frozenset[str] = frozenset()) -> EmbeddingPod:
        """The healthy pod embedding with ``model`` that has the fewest
        requests in flight. INVALID_ARGUMENT (param ``model``) when every pod
        of the region has answered and none embeds with it; UNAVAILABLE when
        those that do are down, or some pod has not answered yet."""
        candidates = [
            e
            for _, e in self._known.values()
            if e is not None and e.info.model == model and e.pod.healthy and e.pod.address not in exclude
        ]
        if candidates:
            return min(candidates, key=lambda e: e.in_flight)
        if not self.serves(model):
            if unanswered := self.unanswered:
                raise Unavailable(
                    Reason.ENGINE_UNAVAILABLE,
                    f"no engine pod of this region that answered embeds with {model!r}; not heard "
                    f"from yet: {', '.join(p.pod_id or p.address for p in unanswered)}",
                    retry_after_s=1.0,
                )
            raise InvalidArgument(
                Reason.UNKNOWN_MODEL,
                f"model {model!r} is not an embedding model served in this region"
                + (f"; embedding models here: {', '.join(self.models)}" if self.models else ""),
                metadata={"param": "model"},
            )
        raise Unavailable(
            Reason.ENGINE_UNAVAILABLE,
            f"no healthy engine pod embeds with {model!r} in this region",
            retry_after_s=1.0,
        )

    def mark_failed(self, target: EmbeddingPod) -> None:
        """Take the pod out of placement until its next good health check."""
        self._pool.mark_failed(target.pod)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
