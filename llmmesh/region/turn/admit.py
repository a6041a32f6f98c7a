"""Admitting a prepared turn: the key's limits, the tenant's quota and a
slot of the fair queue (:mod:`region.admission.control`), then the zone
store's acceptance.

The store takes the turn's request id once for its tenant (request ids are
each tenant's own: another tenant's turn under the same id is a turn of its
own) and accepts a continuation only of a turn the zone started for the
same tenant and model, once. The turn's first event waits until the store
marks it started (:meth:`TurnAdmission.hold_request_id`): a turn whose id
another acceptance took over meanwhile (a retry of a turn that had
streamed nothing) stops before any output.

Where the acceptance holds up engine work: a continuation (the store
vouches for the turn it continues) and a turn whose tenant has a monthly
quota (the store reserves it zone-wide) are accepted before the turn goes
to a pod. A turn of a tenant without a quota only takes its request id, so
its acceptance runs while the pod works on its first token, and the first
event waits for it as well as for the started mark: the claim is off the
turn's critical path, and exactly-once holds, since nothing reaches the
caller, and no usage row is written, before the store has taken the id for
this very acceptance. A reuse of an id whose turn started in this region
is refused at once, before any engine work (the store never lets a started
turn's id go); any other reuse costs the pod the prefill of a reply nobody
sees, never an output token or a usage row. The store alone decides
whether a turn that has not started keeps its id: a retry of a turn that
streamed nothing may take its id over (the edge retries a stalled turn so,
in this region too), and the turn it replaced then stops at its first
event. A turn that ends before its first event leaves its acceptance to
finish on its own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict

from llmmesh.core.errors import AlreadyExists, MeshError, Reason, Unavailable
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.control import Admission
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.policy_cache import Caller
from llmmesh.region.turn.request import ReadyTurn
from llmmesh.region.turn.state import PreparedTurn, Turn
from llmmesh.region.zone_store.rows import AcceptedTurn, TurnStart
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.region.zone_store.turn_starts import duplicate_request
from llmmesh.v1 import chat_service_pb2

log = logging.getLogger(__name__)

# What a queued turn keeps of its caller's deadline for the turn itself.
_DEADLINE_MARGIN_S = 0.1
# Request ids of turns started in this region that it remembers, for its quick refusal of a reuse.
_STARTED_KEPT = 65_536


class TurnAdmission:
    """Admits turns and has the zone store accept them.

    A turn queued for a slot fails at once when its model's last pod goes
    (the pool's health rounds tell)."""

    def __init__(self, admission: Admission, store: ZoneStore, pool: EnginePool) -> None:
        self.admission = admission
        self._store = store
        self._pool = pool
        # (tenant, request id) of the turns started here, newest last.
        self._started: OrderedDict[tuple[str, str], None] = OrderedDict()
        pool.on_checked(self._release_turns_without_pods)

    async def admit(self, ready: ReadyTurn) -> Turn:
        """The admitted turn, holding its slot and quota, accepted by the
        zone store or being accepted (see the module's note); on a refusal,
        nothing stays held."""
        request, caller, prepared = ready.request, ready.caller, ready.prepared
        if (caller.tenant_id, prepared.request_id) in self._started:
            raise duplicate_request(prepared.request_id)
        deadline = request.deadline_s
        queue_deadline = None if deadline is None else max(0.0, deadline - _DEADLINE_MARGIN_S)
        admitted = await self.admission.admit(
            caller,
            len(prepared.token_ids) + prepared.max_output_tokens,
            queue_deadline,
            prepared.model.name,
        )
        request.hops.stamp("admission")
        holder = secrets.token_hex(8)
        accepting = None
        try:
            marker = await self._marker(caller, prepared, request.start, holder)
            if marker.quota is None and marker.continues is None:
                accepting = asyncio.create_task(self._accept(marker))
                # Retrieved here: a turn that ends before its first event never awaits it.
                accepting.add_done_callback(_retrieved)
                accepted = AcceptedTurn()
            else:
                accepted = await self._accept(marker)
        except BaseException:
            admitted.release_slot()
            await admitted.settle(0)
            admitted.release_quota()
            raise
        request.hops.stamp("store_accept")
        turn = Turn(caller, prepared, admitted, holder, accepted, accepting, hops=request.hops)
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

    async def accept_again(
        self, turn: Turn, prepared: PreparedTurn, start: chat_service_pb2.ChatStart
    ) -> None:
        """Have the zone store accept ``turn`` anew as ``prepared`` (moved to
        another model before its first event), taking over its acceptance:
        the turn gets a new holder and what the store knew. An acceptance of
        the old holder still running is let finish first, so that it cannot
        take the id back."""
        if turn.accepting is not None:
            await asyncio.wait([turn.accepting])
            turn.accepting = None
        holder = secrets.token_hex(8)
        turn.accepted = await self._accept(await self._marker(turn.caller, prepared, start, holder))
        turn.holder = holder

    async def _marker(
        self, caller: Caller, prepared: PreparedTurn, start: chat_service_pb2.ChatStart, holder: str
    ) -> TurnStart:
        return TurnStart(
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

    async def _accept(self, marker: TurnStart) -> AcceptedTurn:
        """The zone store takes the turn's request id (once per tenant) and,
        for a continuation (from a caller
        :func:`~region.turn.request.require_continuation_allowed` let
        through), vouches for the turn it continues: started by this tenant,
        with this model, not continued before, and carrying no more tokens
        than it could produce. A turn of its own is checked against its
        tenant's quota counted over every region of the zone."""
        try:
            return await self._store.accept_turn(marker)
        except MeshError:
            raise
        except Exception as err:
            # A turn the zone store cannot vouch for is not run: it could not be billed either.
            log.exception("turn %s: the zone store could not accept it", marker.request_id)
            raise Unavailable(
                Reason.REGION_UNAVAILABLE, "the zone store cannot accept turns now", retry_after_s=1.0
            ) from err

    async def hold_request_id(self, turn: Turn) -> None:
        """Mark the turn started before its first event goes out; ALREADY_EXISTS
        when another acceptance took its request id over meanwhile."""
        request_id = turn.prepared.request_id
        if turn.accepting is not None:
            await asyncio.shield(turn.accepting)  # its refusal again if the turn is placed again
            turn.accepting = None
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
        self._started[(turn.caller.tenant_id, request_id)] = None
        if len(self._started) > _STARTED_KEPT:
            self._started.popitem(last=False)

    def _release_turns_without_pods(self) -> None:
        released = self.admission.refuse_waiting(self._pool.no_pod_for)
        if released:
            log.warning("%d queued turns released: their model has no healthy engine pod left", released)


def _retrieved(done: asyncio.Task[AcceptedTurn]) -> None:
    if not done.cancelled():
        done.exception()
