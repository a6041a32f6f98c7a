"""``ChatService.SettleTurn``: an edge settles a turn the mesh failed, or
one it continued in another region, to the output its client received
(:mod:`region.zone_store.settlement`). Only the edge knows what reached
the client, so only its certificate may ask; the turn is the caller's
key's tenant's. Rows written or changed here are shipped to billing as any
usage row is."""

from __future__ import annotations

import logging

from google.protobuf import timestamp_pb2

from llmmesh.core.access import require_caller
from llmmesh.core.identity import Role as PlaneRole
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.region.usage_shipper import UsageShipper
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import billing_service_pb2, chat_service_pb2, common_pb2

log = logging.getLogger(__name__)


class RecordCodec:
    """Usage rows as serialized ``UsageRecord`` messages of one tenant's
    turn, written by ``region`` (a region ships only the records it wrote)."""

    def __init__(self, tenant_id: str, region: str) -> None:
        self._tenant_id = tenant_id
        self._region = region

    def output_of(self, usage: bytes) -> int:
        return int(billing_service_pb2.UsageRecord.FromString(usage).usage.output_tokens)

    def with_output(self, usage: bytes, output_tokens: int) -> bytes:
        record = billing_service_pb2.UsageRecord.FromString(usage)
        record.usage.output_tokens = output_tokens
        return record.SerializeToString()

    def new_row(
        self, request_id: str, model: str, input_tokens: int, output_tokens: int, continues: str = ""
    ) -> bytes:
        end = timestamp_pb2.Timestamp()
        end.GetCurrentTime()
        # A shipped row of the turn's own is written only for a turn that failed before any region
        # recorded it (the others are placeholders, never shipped); a continuation's share has no finish.
        reason = common_pb2.FINISH_REASON_UNSPECIFIED if continues else common_pb2.FINISH_REASON_ERROR
        return billing_service_pb2.UsageRecord(
            request_id=request_id,
            tenant_id=self._tenant_id,
            model=model,
            region=self._region,
            usage=common_pb2.TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens),
            finish_reason=reason,
            end_time=end,
            continues_request_id=continues,
        ).SerializeToString()


class TurnSettlement:
    """Settles turns in the zone store, then lets the shipper bill them."""

    def __init__(self, region: str, policy: PolicyCache, store: ZoneStore, shipper: UsageShipper) -> None:
        self._region = region
        self._policy = policy
        self._store = store
        self._shipper = shipper

    async def settle(
        self, request: chat_service_pb2.SettleTurnRequest, secret: str | None
    ) -> chat_service_pb2.SettleTurnResponse:
        """Bill the caller's tenant's turn ``request.request_id`` the output
        its client received. Raises MeshError: PERMISSION_DENIED for a
        caller that is not an edge, UNAUTHENTICATED, and the store's refusals."""
        require_caller((PlaneRole.EDGE,), "settle a turn's usage")
        caller = await self._policy.authenticate_fresh(secret)
        codec = RecordCodec(caller.tenant_id, self._region)
        settled = await self._store.settle_turn(
            caller.tenant_id, request.request_id, request.delivered_output_tokens, codec
        )
        self._shipper.notify()
        log.log(
            logging.WARNING if settled.over_billed_output_tokens else logging.INFO,
            "turn %s (tenant %s) settled to the %d output tokens its client received; "
            "%d output tokens billing already took beyond that stay billed",
            request.request_id,
            caller.tenant_id,
            request.delivered_output_tokens,
            settled.over_billed_output_tokens,
        )
        return chat_service_pb2.SettleTurnResponse(
            billed_output_tokens=settled.billed_output_tokens,
            over_billed_output_tokens=settled.over_billed_output_tokens,
        )
