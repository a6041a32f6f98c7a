"""Disaggregated serving at the region: a turn's prefill phase on a prefill
pod, its decode phase on a decode pod, the KV handle passed between them.

The router (:meth:`region.placement.router.KvAffinityRouter.choose`) places the
prefill phase by its policy over the prefill pods (prefix affinity pays off
there, where prompts are computed) and the decode phase on a decode pod:
under ``precise`` scored by the prompt's blocks already resident there (a
decode pod pulls only the blocks it lacks, and turns sharing a prefix
share its blocks in the decode pod's cache) and by load, else the least
loaded. It hands the gateway the decode pod's :class:`~region.engine_pool.PodView`
with a :class:`PhasedSession` (:func:`phased_pod`): to the gateway it is
the decode pod (its id, address, load and health are the decode pod's), but
starting a generation on it first runs ``prefill_only`` on the prefill pod
and starts the decode pod's generation with the ``KvTransfer`` handle the
prefill finished with. The engine side is :mod:`engine.sim.disaggregation`.

When the prefill pod fails (UNAVAILABLE) the decode pod serves the whole
turn itself, prefilling the prompt: the prefill pod is taken out of
placement until its next good health check, and the turn neither fails
nor moves off the decode pod. Any other error of the prefill phase (a
refused prompt) is the turn's error. The prefill phase produces no output,
so nothing of it is metered: the decode phase's usage, which counts the
prompt, is the turn's. Started turns and prefill fallbacks are counted
(:mod:`region.metrics_phases`).
"""

from __future__ import annotations

import grpc
import grpc.aio

from llmmesh.core.errors import MeshError, Reason, Unavailable, from_stream_error
from llmmesh.core.session_client import SessionClient
from llmmesh.region import metrics_phases
from llmmesh.region.engine_pool import EnginePodHandle, PodView
from llmmesh.region.engine_session import EngineSession, SessionGeneration
from llmmesh.v1 import engine_service_pb2 as pb

PREFILL_SUFFIX = ":prefill"


def role_of(pod: EnginePodHandle) -> int:
    """The pod's role as it reported it; unstated is a whole-turn pod."""
    return pod.info.role or pb.POD_ROLE_BOTH


async def run_prefill(prefill: EnginePodHandle, request_id: str, start: pb.GenerateStart) -> pb.KvTransfer:
    """Run the prefill phase of ``start`` on ``prefill``; the KV handle it
    finished with. Raises the phase's MeshError."""
    phase = pb.GenerateStart()
    phase.CopyFrom(start)
    phase.request_id = request_id + PREFILL_SUFFIX
    phase.prefill_only = True
    prefill.in_flight += 1
    generation: SessionGeneration | None = None
    try:
        generation = await prefill.session.start(phase.request_id, pb.GenerateSessionRequest(start=phase))
        async for event in generation:
            kind = event.WhichOneof("event")
            if kind == "error":
                raise from_stream_error(event.error)
            if kind == "finished":
                if not event.finished.HasField("kv_transfer"):
                    break
                return event.finished.kv_transfer
    finally:
        prefill.in_flight -= 1
        if generation is not None:
            generation.abandon("the prefill phase ended")
    raise Unavailable(
        Reason.ENGINE_FAILED,
        f"prefill pod {prefill.pod_id} finished without a KV transfer",
        retry_after_s=1.0,
    )


class PhasedSession(SessionClient[pb.GenerateSessionRequest, pb.GenerationEvent]):
    """The decode pod's session, with each start preceded by its prefill
    phase. Only :meth:`start` is used: the stream is the decode pod's."""

    def __init__(self, prefill: EnginePodHandle, decode: EngineSession) -> None:
        # Deliberately not SessionClient.__init__: this opens no stream of its own.
        self._prefill = prefill
        self._decode = decode

    async def start(self, request_id: str, message: pb.GenerateSessionRequest) -> SessionGeneration:
        decode_message = pb.GenerateSessionRequest()
        decode_message.CopyFrom(message)
        fallback = False
        try:
            handle = await run_prefill(self._prefill, request_id, message.start)
        except MeshError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE:
                raise
            # The decode pod prefills the prompt itself.
            self._prefill.healthy = False
            fallback = True
        else:
            decode_message.start.kv_transfer.CopyFrom(handle)
        generation = await self._decode.start(request_id, decode_message)
        metrics_phases.disaggregated_turn(fallback)
        return generation

    async def close(self) -> None:
        """Nothing to close: both pods' sessions belong to the pool."""


def phased_pod(prefill: EnginePodHandle, decode: EnginePodHandle) -> PodView:
    """The decode pod, its session preceded by the prefill phase on ``prefill``."""
    return PodView(decode, PhasedSession(prefill, decode.session))
