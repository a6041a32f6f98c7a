"""``BillingService``: a thin gRPC face on :class:`UsageLedger`."""

from __future__ import annotations

from globalplane.protoconv import datetime_of
from globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from globalplane.usage_ledger import UsageLedger, UsageRecord
from llmmesh.pricing import format_usd
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import billing_service_pb2_grpc

SERVICE_NAME = "llmmesh.v1.BillingService"


def usage_record_from_proto(record: bpb.UsageRecord) -> UsageRecord:
    return UsageRecord(
        request_id=record.request_id,
        tenant_id=record.tenant_id,
        model=record.model,
        region=record.region,
        input_tokens=record.usage.input_tokens,
        output_tokens=record.usage.output_tokens,
        cached_input_tokens=record.usage.cached_input_tokens,
        end_time=datetime_of(record.end_time) if record.HasField("end_time") else None,
    )


# Method names are the RPC names the generated base class declares (hence N802).
class BillingServicer(billing_service_pb2_grpc.BillingServiceServicer):
    """Usage ingestion, totals and reconciliation."""

    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger

    async def RecordUsage(
        self, request: bpb.RecordUsageRequest, context: ServicerContext
    ) -> bpb.RecordUsageResponse:
        async with abort_on_mesh_error(context):
            outcome = await self._ledger.record([usage_record_from_proto(r) for r in request.records])
            return bpb.RecordUsageResponse(accepted=outcome.accepted, duplicates=outcome.duplicates)

    async def GetUsage(self, request: bpb.GetUsageRequest, context: ServicerContext) -> bpb.GetUsageResponse:
        async with abort_on_mesh_error(context):
            totals = await self._ledger.usage(request.tenant_id, request.period)
            return bpb.GetUsageResponse(
                period=totals.period,
                input_tokens=totals.input_tokens,
                output_tokens=totals.output_tokens,
                cost_usd=format_usd(totals.cost_usd),
                requests=totals.requests,
            )

    async def ReconcileUsage(
        self, request: bpb.ReconcileUsageRequest, context: ServicerContext
    ) -> bpb.ReconcileUsageResponse:
        async with abort_on_mesh_error(context):
            missing = await self._ledger.reconcile(request.request_ids)
            return bpb.ReconcileUsageResponse(missing_request_ids=missing)
