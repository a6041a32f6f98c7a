"""Recording a turn: whatever was delivered is written with its usage in
one zone-store transaction, then the rate limit and quota are settled and
the usage shipper bills it. A record the store cannot take now is kept and
retried (:mod:`region.lifecycle.retry`), spooled so that a restart retries
it too: billed-for tokens were delivered, so no record is dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.protobuf import timestamp_pb2

from llmmesh.core import tracing
from llmmesh.core.errors import MeshError
from llmmesh.region import metrics as region_metrics
from llmmesh.region.lifecycle.retry import RecordRetries
from llmmesh.region.lifecycle.spool import SpooledTurn, usage_rows
from llmmesh.region.modelchoice.model_policy import turn_cost
from llmmesh.region.policy_cache import Caller
from llmmesh.region.settings import RegionSettings
from llmmesh.region.turn.state import PreparedTurn, Turn, TurnMeter
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.rows import AssistantMessage, ContinuedTurn, Role, TurnRecord
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import billing_service_pb2, common_pb2

log = logging.getLogger(__name__)


def now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


class TurnRecorder:
    """Records turns, each in a task of its own. ``retries`` keeps the
    records the store refused (None: such a record is only logged)."""

    def __init__(
        self,
        settings: RegionSettings,
        store: ZoneStore,
        shipper: UsageShipper,
        retries: RecordRetries | None = None,
        clock: Callable[[], timestamp_pb2.Timestamp] = now,
    ) -> None:
        self._settings = settings
        self._store = store
        self._shipper = shipper
        self.retries = retries
        self._now = clock
        # Turn records being written; a drain waits for them.
        self._recording: set[asyncio.Task[str]] = set()

    def start(self, turn: Turn) -> asyncio.Task[str]:
        """Record the turn in its own task (once): a caller that goes away
        cancels the stream, never the write of what it was billed for. The
        task's result is the stored assistant message's id ("" when none
        was stored)."""
        if turn.record is None:
            turn.record = asyncio.create_task(self._record_turn(turn))
            self._recording.add(turn.record)
            turn.record.add_done_callback(self._recording.discard)
        return turn.record

    async def drain(self, retry_grace_s: float = 5.0) -> None:
        """Wait for the turn records still being written, and up to
        ``retry_grace_s`` for those being retried."""
        if self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)
        if self.retries is not None:
            await self.retries.drain(retry_grace_s)

    async def _record_turn(self, turn: Turn) -> str:
        """Write the reply and its usage row in one zone-store transaction,
        then settle the rate limit and quota and let the shipper bill it."""
        caller, prepared, meter, admitted = turn.caller, turn.prepared, turn.meter, turn.admitted
        message_id = ""
        try:
            if meter.started:
                attributes = {"llmmesh.plane": "region", "db.operation.name": "record_turn"}
                with tracing.span("zone store write", attributes=attributes):
                    message_id = await self._write_record(caller, prepared, meter)
        finally:
            # A continuation's prompt was counted, as far as the original's went, where the turn began.
            prompt = max(0, meter.input_tokens - turn.accepted.counted_prompt_tokens)
            await admitted.settle(prompt + meter.output_tokens)
            region_metrics.turn_ended(
                prepared.model.name,
                caller.tenant_id,
                meter.reason,
                prompt,
                meter.output_tokens,
                meter.cached_input_tokens,
            )
            admitted.release_quota()
        return message_id

    async def _write_record(self, caller: Caller, prepared: PreparedTurn, meter: TurnMeter) -> str:
        model = prepared.model
        reason = meter.reason or common_pb2.FINISH_REASON_CANCELLED
        whole = meter.usage()

        # The region that records a row ships it, and billing takes a
        # region's records only in its own name: a continued turn's
        # original row, written here, is this region's too.
        template = billing_service_pb2.UsageRecord(
            request_id=prepared.request_id,
            tenant_id=caller.tenant_id,
            model=model.name,
            region=self._settings.region,
            usage=common_pb2.TokenUsage(
                input_tokens=meter.input_tokens,
                output_tokens=meter.output_tokens,
                cached_input_tokens=meter.cached_input_tokens,
            ),
            finish_reason=reason,
            end_time=self._now(),
            end_user=prepared.end_user,
        ).SerializeToString()

        assistant = AssistantMessage(
            content=meter.reply_text(),
            model=model.name,
            finish_reason=common_pb2.FinishReason.Name(reason),
            input_tokens=whole.input_tokens,
            output_tokens=whole.output_tokens,
            cached_input_tokens=whole.cached_input_tokens,
            cost_usd=turn_cost(model, whole.input_tokens, whole.output_tokens),
            tool_calls=meter.reply_tool_calls(),
        )
        # The record is made from these values alone, so a region restart can retry it.
        continued = None
        if prepared.continues is not None:
            continued = ContinuedTurn(
                prepared.continues, meter.input_tokens, meter.carried_tokens, meter.carried_text
            )
        # A turn of its own has its one usage row; a continuation, the template of its rows.
        usage = template
        if continued is None:
            usage = usage_rows(template)(prepared.request_id, meter.input_tokens, meter.output_tokens, "")
        spooled = SpooledTurn(
            caller.tenant_id,
            prepared.conversation_id,
            prepared.request_id,
            prepared.user_text,
            assistant,
            usage,
            meter.input_tokens + meter.output_tokens,
            prepared.tool_results,
            prepared.parent_id,
            continued,
            meter.output_tokens,
        )

        async def write() -> TurnRecord:
            return await spooled.write(self._store)

        try:
            record = await write()
        except MeshError:
            # The store refused the record itself (a request id taken elsewhere): no retry can help.
            log.exception(
                "turn %s (tenant %s, user %r): its usage could not be recorded",
                prepared.request_id,
                caller.tenant_id,
                prepared.end_user,
            )
            return ""
        except Exception:
            # The store failed: the tokens were delivered, so the record is kept and written when it can be.
            log.exception(
                "turn %s (tenant %s): writing its record failed; retrying",
                prepared.request_id,
                caller.tenant_id,
            )
            if self.retries is None:
                return ""
            self.retries.keep(prepared.request_id, write, spooled)
            return ""
        self._shipper.notify()
        # The end user, as OpenAI's `user` asks, for abuse tracking in the region's log.
        log.info(
            "turn %s: tenant %s, user %r, %s, %d input and %d output tokens",
            prepared.request_id,
            caller.tenant_id,
            prepared.end_user,
            common_pb2.FinishReason.Name(reason),
            whole.input_tokens,
            whole.output_tokens,
        )
        return next((m.id for m in record.messages if m.role == Role.ASSISTANT), "")
