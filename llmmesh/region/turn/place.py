"""Placing a turn: the KV-affinity router picks one of its model's pods
(prefix blocks it holds, load; hedging and prefill/decode phases are the
router's), and a pod that fails before the turn's first event gives way to
another. With no pod of the model left here, a turn that may fall back
moves to another model of the region, prepared and accepted again under
the same request id.

A generation that fails after the first event (its pod's session broke,
the pod cancelled its generations as it went away, or the pod ended it
with an engine failure) goes on on another healthy pod of the same model
here: that pod is given the prompt and every token
delivered so far, and the caller's stream goes on with the next delta, no
token lost or repeated, before the edge would cross regions. Only when no
other pod of the model is left does the turn end with the error, and the
edge continue it in another region of the zone."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from llmmesh.core.errors import MeshError, Unavailable
from llmmesh.region import metrics as region_metrics
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.placement.router import KvAffinityRouter
from llmmesh.region.turn.admit import TurnAdmission
from llmmesh.region.turn.prepare import TurnPreparation
from llmmesh.region.turn.request import ReadyTurn
from llmmesh.region.turn.state import Turn
from llmmesh.region.turn.stream import PodFailedEarly, PodFailedMidStream, PodStream
from llmmesh.v1 import chat_service_pb2

log = logging.getLogger(__name__)


class TurnPlacement:
    """The place stage, and the pod stream it runs the turn on."""

    def __init__(
        self,
        router: KvAffinityRouter,
        pool: EnginePool,
        preparation: TurnPreparation,
        admission: TurnAdmission,
        pods: PodStream,
    ) -> None:
        self._router = router
        self._pool = pool
        self._preparation = preparation
        self._admission = admission
        self._pods = pods

    async def stream(self, ready: ReadyTurn, turn: Turn) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        """The turn's events, from the first pod that takes it."""
        start, cancel = ready.request.start, ready.request.cancel
        tried: set[str] = set()
        failed_models: set[str] = set()
        broke: MeshError | None = None
        while True:
            prepared, meter = turn.prepared, turn.meter
            resume = [*start.continuation.emitted_token_ids, *meter.delivered_token_ids]
            try:
                decision = await self._router.choose(
                    prepared.model.name, [*prepared.token_ids, *resume], exclude=tried
                )
            except Unavailable as error:
                if broke is not None:
                    # Mid-stream, with no other pod of its model here: the edge goes on elsewhere.
                    yield self._pods.failed(turn, broke)
                    return
                # No pod of the model is left here: another model may take the turn.
                if not await self._move_to_another_model(ready, turn, failed_models):
                    raise error from None
                tried.clear()
                continue
            if turn.hops is not None:
                turn.hops.stamp("route")
            if broke is not None:
                meter.take_over()
                region_metrics.turn_moved(prepared.model.name)
            elif tried:
                region_metrics.turn_placed_again(prepared.model.name)
                log.warning(
                    "turn %s: pod %s takes it over after %d delivered tokens",
                    prepared.request_id,
                    decision.pod.pod_id,
                    len(meter.delivered_token_ids),
                )
            pod = decision.pod
            region_metrics.routed(
                prepared.model.name,
                decision.policy.value,
                pod.pod_id,
                len(prepared.token_ids),
                decision.resident_tokens,
            )
            try:
                async for event in self._pods.run(pod, start, turn, cancel):
                    yield event
                return
            except PodFailedEarly:
                tried.add(pod.address)
                self._pool.mark_failed(pod)
                log.warning(
                    "turn %s: pod %s failed before output; trying another", prepared.request_id, pod.pod_id
                )
            except PodFailedMidStream as failed:
                tried.add(pod.address)
                if failed.pod_gone:
                    self._pool.mark_failed(pod)
                broke = failed.error
                log.warning("turn %s: pod %s failed mid-stream: %s", prepared.request_id, pod.pod_id, broke)

    async def _move_to_another_model(self, ready: ReadyTurn, turn: Turn, failed_models: set[str]) -> bool:
        """Give a turn whose model has no pod left here before its first
        event to another model of this region, when the turn may fall back
        (:meth:`ModelRouter.after_failure`): prepared for that model with the
        same lead (a conversation turn's excerpts and facts) and accepted
        again under the same request id (taking over the acceptance that
        streamed nothing). False when it stays put."""
        start = ready.request.start
        failed = turn.prepared.model
        model = await self._preparation.model_router.after_failure(
            start, turn.caller, failed, failed_models, ready.route
        )
        failed_models.add(failed.name)
        if model is None:
            return False
        again = chat_service_pb2.ChatStart()
        again.CopyFrom(start)
        again.request_id = turn.prepared.request_id
        try:
            prepared = await self._preparation.prompts.prepare(turn.caller, model, again, ready.lead)
            await self._admission.accept_again(turn, prepared, again)
        except MeshError as error:
            log.warning("turn %s cannot fall back to %s: %s", again.request_id, model.name, error.message)
            return False
        turn.prepared = prepared
        arrived_s = turn.meter.latency.arrived_s if turn.meter.latency else time.monotonic()
        turn.meter.latency = region_metrics.TurnLatency(model.name, arrived_s)
        return True
