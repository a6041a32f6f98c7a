"""``BillingService``: a thin gRPC face on :class:`UsageLedger`."""

from __future__ import annotations

from collections.abc import Sequence

from llmmesh.core.access import current_caller, require_caller
from llmmesh.core.errors import PermissionDenied, Reason
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.pricing import format_usd
from llmmesh.core.usage_purpose import purpose_name, purpose_proto
from llmmesh.globalplane import metrics as global_metrics
from llmmesh.globalplane.clock import utc_now
from llmmesh.globalplane.protoconv import datetime_of
from llmmesh.globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.usage_ledger import UsageLedger, UsageRecord
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
        continues_request_id=record.continues_request_id,
        end_user=record.end_user,
        purpose=purpose_name(record.purpose),
    )


# Method names are the RPC names the generated base class declares (hence N802).
class BillingServicer(billing_service_pb2_grpc.BillingServiceServicer):
    """Usage ingestion, totals and reconciliation."""

    def __init__(self, ledger: UsageLedger, tenants: TenantBook) -> None:
        self._ledger = ledger
        self._tenants = tenants

    async def _check_reporter(self, region: PlaneIdentity, records: Sequence[bpb.UsageRecord]) -> None:
        """A region ships only its own turns, of tenants of its own zone."""
        for record in records:
            if record.region != region.region:
                raise PermissionDenied(
                    Reason.PEER_NOT_ALLOWED,
                    f"{region} may not record usage for region {record.region!r}",
                    metadata={"peer": region.uri},
                )
        for tenant_id in {r.tenant_id for r in records}:
            if await self._tenants.zone_of(tenant_id) != region.zone:
                raise PermissionDenied(
                    Reason.PEER_NOT_ALLOWED,
                    f"{region} may not record usage for tenant {tenant_id!r} of another zone",
                    metadata={"peer": region.uri},
                )

    async def _check_reader(self, tenant_id: str) -> None:
        """A region reads the usage of its own zone's tenants only (for their
        quotas); the edge and operators read any tenant's."""
        ident = current_caller().identity
        if ident is None or ident.role != Role.REGION:
            return
        if await self._tenants.zone_of(tenant_id) != ident.zone:
            raise PermissionDenied(
                Reason.PEER_NOT_ALLOWED,
                f"{ident} may not read the usage of tenant {tenant_id!r} of another zone",
                metadata={"peer": ident.uri},
            )

    async def RecordUsage(
        self, request: bpb.RecordUsageRequest, context: ServicerContext
    ) -> bpb.RecordUsageResponse:
        async with abort_on_mesh_error(context):
            region = require_caller((Role.REGION,), "record usage")
            if region is not None:
                await self._check_reporter(region, request.records)
            outcome = await self._ledger.record([usage_record_from_proto(r) for r in request.records])
            global_metrics.usage_recorded(request.records, outcome.accepted, outcome.duplicates, utc_now())
            return bpb.RecordUsageResponse(accepted=outcome.accepted, duplicates=outcome.duplicates)

    async def GetUsage(self, request: bpb.GetUsageRequest, context: ServicerContext) -> bpb.GetUsageResponse:
        async with abort_on_mesh_error(context):
            await self._check_reader(request.tenant_id)
            totals = await self._ledger.usage(request.tenant_id, request.period, request.end_user)
            by_model = await self._ledger.usage_by_model(request.tenant_id, totals.period, request.end_user)
            return bpb.GetUsageResponse(
                period=totals.period,
                input_tokens=totals.input_tokens,
                output_tokens=totals.output_tokens,
                cost_usd=format_usd(totals.cost_usd),
                requests=totals.requests,
                models=[
                    bpb.ModelUsage(
                        model=name,
                        requests=t.requests,
                        input_tokens=t.input_tokens,
                        output_tokens=t.output_tokens,
                        cost_usd=format_usd(t.cost_usd),
                        purpose=purpose_proto(purpose),
                    )
                    for (name, purpose), t in by_model.items()
                ],
            )

    async def ReconcileUsage(
        self, request: bpb.ReconcileUsageRequest, context: ServicerContext
    ) -> bpb.ReconcileUsageResponse:
        async with abort_on_mesh_error(context):
            if request.tenant_id:
                await self._check_reader(request.tenant_id)
            missing = await self._ledger.reconcile(request.request_ids, request.tenant_id)
            return bpb.ReconcileUsageResponse(missing_request_ids=missing)
