"""The region gateway: one chat turn from an authenticated start message to
its metered end, as a sequence of stages, each a module of
:mod:`region.turn`:

1. **prepare** (:mod:`region.turn.prepare`): authentication on the cached
   policy snapshot, validation, the model, the input safety filter (before
   any engine work), retrieval excerpts and remembered facts, and the
   prompt: a conversation's stored history fitted into the model's window,
   counted in the engine's tokens;
2. **admit** (:mod:`region.turn.admit`): the key's RPM/TPM limits, the
   tenant's monthly quota, a slot from the weighted fair queue, then the
   zone store's acceptance of the turn's request id (and of what a
   continuation carries);
3. **place** (:mod:`region.turn.place`): the KV-affinity router's pod, and
   another pod (or model) when one fails before the first event;
4. **stream** (:mod:`region.turn.stream`): the pod's generation through the
   streaming output filter, a continuation resumed after what its client has;
5. **record** (:mod:`region.turn.record`): whatever was delivered, with its
   usage, in one zone-store transaction, then billed.

A turn may be the continuation of one whose region failed mid-stream
(``ChatStart.continuation``): its prompt is the original turn's, the pod
resumes after the tokens the client already has, deltas are numbered on
from the client's last one, and the usage it reports is the whole turn's.
It is recorded by :meth:`ZoneStore.record_continuation`, which bills the
turn once whichever region records first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from llmmesh.region.admission.control import Admission
from llmmesh.region.knowledge.memory import UserMemory
from llmmesh.region.modelchoice.difficulty_route import ModelRouter
from llmmesh.region.turn.admit import TurnAdmission
from llmmesh.region.turn.place import TurnPlacement
from llmmesh.region.turn.prepare import TurnPreparation
from llmmesh.region.turn.record import TurnRecorder
from llmmesh.region.turn.request import TurnRequest
from llmmesh.region.turn.state import Turn
from llmmesh.v1 import chat_service_pb2, common_pb2


class ChatGateway:
    """Runs chat turns through their stages."""

    def __init__(
        self,
        preparation: TurnPreparation,
        admission: TurnAdmission,
        placement: TurnPlacement,
        recorder: TurnRecorder,
    ) -> None:
        self._preparation = preparation
        self._admission = admission
        self._placement = placement
        self._recorder = recorder

    @property
    def preparation(self) -> TurnPreparation:
        return self._preparation

    @property
    def admission(self) -> Admission:
        return self._admission.admission

    @property
    def model_router(self) -> ModelRouter:
        return self._preparation.model_router

    @property
    def memory(self) -> UserMemory | None:
        return self._preparation.knowledge.memory

    async def run_turn(
        self,
        start: chat_service_pb2.ChatStart,
        secret: str | None,
        cancel: asyncio.Event,
        deadline_s: float | None = None,
        *,
        allow_continuation: bool = True,
    ) -> AsyncGenerator[chat_service_pb2.ChatResponse, None]:
        """Stream the events of one turn.

        Errors before the first event are raised as MeshError; later ones end
        the stream with an ``error`` event. Whatever was delivered is metered
        once, also when the caller goes away (the generator is closed or
        cancelled). ``deadline_s`` is how long the caller will wait; a turn
        that would queue longer than that is shed at once.
        ``allow_continuation`` says whether the caller may continue a turn
        at all (:func:`region.turn.request.require_continuation_allowed`).
        ``start`` is never changed: the turn works on its own copy.
        """
        request = TurnRequest.arrived(
            start, secret, cancel, deadline_s, allow_continuation=allow_continuation
        )
        ready = await self._preparation.prepare(request)
        turn = await self._admission.admit(ready)
        try:
            async for event in self._placement.stream(ready, turn):
                if event.WhichOneof("event") == "started":
                    event.started.route.CopyFrom(ready.route)
                    if ready.retrieval is not None:
                        event.started.retrieval.CopyFrom(ready.retrieval)
                yield event
        except asyncio.CancelledError:
            turn.meter.reason = common_pb2.FINISH_REASON_CANCELLED
            raise
        finally:
            self._end(ready.request, turn)

    def _end(self, request: TurnRequest, turn: Turn) -> None:
        turn.admitted.release_slot()
        self._recorder.start(turn)
        self._preparation.knowledge.learn_soon(request.start, turn.caller, turn.prepared.request_id)

    async def drain_memory(self) -> None:
        """Wait for the end users' facts still being learned."""
        await self._preparation.knowledge.drain()

    async def drain(self, retry_grace_s: float = 5.0) -> None:
        """Wait for the turn records still being written, and up to
        ``retry_grace_s`` for those being retried."""
        await self._recorder.drain(retry_grace_s)
