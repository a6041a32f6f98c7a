"""Admitting a prepared turn: the key's limits, the tenant's quota and a
slot of the fair queue (:mod:`region.admission.control`), then the zone
store's acceptance, the gate every turn passes before any engine work.

The store takes the turn's request id once for its tenant (request ids are
each tenant's own: another tenant's turn under the same id is a turn of its
own) and accepts a continuation only of a turn the zone started for the
same tenant and model, once. The turn's first event waits until the store
marks it started (:meth:`TurnAdmission.hold_request_id`): a turn whose id
another acceptance took over meanwhile (a retry of a turn that had
streamed nothing) stops before any output.
"""

from __future__ import annotations

import logging
import secrets

from llmmesh.core.errors import AlreadyExists, MeshError, Reason, Unavailable
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.control import Admission
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.policy_cache import Caller
from llmmesh.region.turn.request import ReadyTurn
from llmmesh.region.turn.state import PreparedTurn, Turn
from llmmesh.region.zone_store.rows import AcceptedTurn, TurnStart
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import chat_service_pb2

log = logging.getLogger(__name__)

# What a queued turn keeps of its caller's deadline for the turn itself.
_DEADLINE_MARGIN_S = 0.1


class TurnAdmission:
    """Admits turns and has the zone store accept them.

    A turn queued for a slot fails at once when its model's last pod goes
    (the pool's health rounds tell)."""

    def __init__(self, admission: Admission, store: ZoneStore, pool: EnginePool) -> None:
        self.admission = admission
        self._store = store
        self._pool = pool
        pool.on_checked(self._release_turns_without_pods)

    async def admit(self, ready: ReadyTurn) -> Turn:
        """The admitted and accepted turn, holding its slot and quota; on a
        refusal, nothing stays held."""
        request, caller, prepared = ready.request, ready.caller, ready.prepared
        deadline = request.deadline_s
        queue_deadline = None if deadline is None else max(0.0, deadline - _DEADLINE_MARGIN_S)
        admitted = await self.admission.admit(
            caller,
            len(prepared.token_ids) + prepared.max_output_tokens,
            queue_deadline,
            prepared.model.name,
        )
        request.hops.stamp("admission")
        try:
            holder, accepted = await self.accept(caller, prepared, request.start)
        except BaseException:
            admitted.release_slot()
            await admitted.settle(0)
            admitted.release_quota()
            raise
        request.hops.stamp("store_accept")
        turn = Turn(caller, prepared, admitted, holder, accepted, hops=request.hops)
        meter = turn.meter
        meter.latency = region_metrics.TurnLatency(prepared.model.name, request.arrived_s)
        continuation = request.continuation
        if continuation is not None:
            region_metrics.continuation_accepted()
            meter.carried_tokens = len(continuation.emitted_token_ids)
            meter.carried_text = continuation.emitted_text
            meter.tool_calls.carry(
                continuation.emitted_tool_calls, caller.tenant_id, prepared.original_request_id
            )
        return turn

    async def accept(
        self,
        caller: Caller,
        prepared: PreparedTurn,
        start: chat_service_pb2.ChatStart,
    ) -> tuple[str, AcceptedTurn]:
        """The zone store takes the turn's request id (once per tenant) and,
        for a continuation (from a caller
        :func:`~region.turn.request.require_continuation_allowed` let
        through), vouches for the turn it continues: started by this tenant,
        with this model, not continued before, and carrying no more tokens
        than it could produce. A turn of its own is checked against its
        tenant's quota counted over every region of the zone.

        Returns this acceptance's holder token and what the store knew.
        """
        holder = secrets.token_hex(8)
        start_marker = TurnStart(
            request_id=prepared.request_id,
            tenant_id=caller.tenant_id,
            model=prepared.model.name,
            prompt_tokens=len(prepared.token_ids),
            max_output_tokens=prepared.max_output_tokens,
            holder=holder,
            continues=prepared.continues,
            carried_tokens=len(start.continuation.emitted_token_ids),
            quota=None if prepared.continues is not None else await self.admission.quota.zone_check(caller),
        )
        try:
            accepted = await self._store.accept_turn(start_marker)
        except MeshError:
            raise
        except Exception as err:
            # A turn the zone store cannot vouch for is not run: it could not be billed either.
            log.exception("turn %s: the zone store could not accept it", prepared.request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot accept turns now", retry_after_s=1.0
            ) from err
        return holder, accepted

    async def hold_request_id(self, turn: Turn) -> None:
        """Mark the turn started before its first event goes out; ALREADY_EXISTS
        when another acceptance took its request id over meanwhile."""
        request_id = turn.prepared.request_id
        try:
            held = await self._store.mark_started(turn.caller.tenant_id, request_id, turn.holder)
        except Exception as err:
            log.exception("turn %s: the zone store could not mark it started", request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot accept turns now", retry_after_s=1.0
            ) from err
        if not held:
            raise AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"request id {request_id!r} was taken over by a retry of the turn",
                metadata={"request_id": request_id},
            )

    def _release_turns_without_pods(self) -> None:
        released = self.admission.refuse_waiting(self._pool.no_pod_for)
        if released:
            log.warning("%d queued turns released: their model has no healthy engine pod left", released)
