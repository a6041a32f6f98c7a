"""``PolicyService``: a thin gRPC face on :class:`TenantBook`."""

from __future__ import annotations

import json

from llmmesh.globalplane import metrics as global_metrics
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.paging import page_of, page_window
from llmmesh.globalplane.policy_records import ApiKey, PolicySnapshot, Tenant, TenantUpdate
from llmmesh.globalplane.protoconv import datetime_of, required_tier, tier_from_proto, tier_to_proto, timestamp
from llmmesh.globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.core.access import require_caller
from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.identity import Role
from llmmesh.v1 import policy_service_pb2 as ppb
from llmmesh.v1 import policy_service_pb2_grpc

SERVICE_NAME = "llmmesh.v1.PolicyService"
_UPDATABLE = frozenset(
    {
        "name",
        "zone",
        "tier",
        "rpm_limit",
        "tpm_limit",
        "monthly_token_quota",
        "allowed_models",
        "conversation_retention_days",
        "memory_enabled",
    }
)


def tenant_to_proto(tenant: Tenant) -> ppb.Tenant:
    return ppb.Tenant(
        id=tenant.id,
        name=tenant.name,
        zone=tenant.zone,
        tier=tier_to_proto(tenant.tier),
        rpm_limit=tenant.rpm_limit,
        tpm_limit=tenant.tpm_limit,
        monthly_token_quota=tenant.monthly_token_quota,
        allowed_models=tenant.allowed_models,
        create_time=timestamp(tenant.create_time),
        conversation_retention_days=tenant.conversation_retention_days,
        memory_enabled=tenant.memory_enabled,
    )


def api_key_to_proto(key: ApiKey) -> ppb.ApiKey:
    proto = ppb.ApiKey(
        id=key.id,
        tenant_id=key.tenant_id,
        display_prefix=key.display_prefix,
        create_time=timestamp(key.create_time),
    )
    if key.expire_time is not None:
        proto.expire_time.CopyFrom(timestamp(key.expire_time))
    if key.revoke_time is not None:
        proto.revoke_time.CopyFrom(timestamp(key.revoke_time))
    return proto


def key_record_to_proto(key: ApiKey) -> ppb.KeyRecord:
    proto = ppb.KeyRecord(
        key_id=key.id,
        tenant_id=key.tenant_id,
        secret_sha256=key.secret_sha256,
        revoked=key.revoke_time is not None,
    )
    if key.expire_time is not None:
        proto.expire_time.CopyFrom(timestamp(key.expire_time))
    return proto


def snapshot_to_proto(snapshot: PolicySnapshot) -> ppb.PolicySnapshot:
    return ppb.PolicySnapshot(
        version=snapshot.version,
        zone=snapshot.zone,
        tenants=[tenant_to_proto(t) for t in snapshot.tenants],
        keys=[key_record_to_proto(k) for k in snapshot.keys],
        create_time=timestamp(snapshot.create_time),
    )


def tenant_update_from_proto(tenant: ppb.Tenant, fields: list[str]) -> TenantUpdate:
    """The update the named ``fields`` of ``tenant`` ask for; unknown names are INVALID_ARGUMENT."""
    unknown = sorted(set(fields) - _UPDATABLE)
    if unknown:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"cannot update {', '.join(unknown)}; updatable: {', '.join(sorted(_UPDATABLE))}",
            metadata={"param": "update_fields"},
        )
    named = set(fields)
    return TenantUpdate(
        name=tenant.name if "name" in named else None,
        zone=tenant.zone if "zone" in named else None,
        tier=required_tier(tenant.tier) if "tier" in named else None,
        rpm_limit=tenant.rpm_limit if "rpm_limit" in named else None,
        tpm_limit=tenant.tpm_limit if "tpm_limit" in named else None,
        monthly_token_quota=tenant.monthly_token_quota if "monthly_token_quota" in named else None,
        allowed_models=tuple(tenant.allowed_models) if "allowed_models" in named else None,
        conversation_retention_days=(
            tenant.conversation_retention_days if "conversation_retention_days" in named else None
        ),
        memory_enabled=tenant.memory_enabled if "memory_enabled" in named else None,
    )


# Method names are the RPC names the generated base class declares (hence N802).
class PolicyServicer(policy_service_pb2_grpc.PolicyServiceServicer):
    """Tenants, API keys and zone policy snapshots."""

    def __init__(self, book: TenantBook, audit: AuditLog) -> None:
        self._book = book
        self._audit = audit

    async def ListAuditEvents(
        self, request: ppb.ListAuditEventsRequest, context: ServicerContext
    ) -> ppb.ListAuditEventsResponse:
        async with abort_on_mesh_error(context):
            after, size = page_window(request.page_size, request.page_token)
            if after is not None and not after.isdigit():
                raise InvalidArgument(
                    Reason.INVALID_REQUEST, "malformed page_token", metadata={"param": "page_token"}
                )
            # Ids are zero-padded in the token so that they order as text.
            page = page_of(await self._audit.list(size + 1, int(after or 0)), lambda e: f"{e.id:020d}", size)
            return ppb.ListAuditEventsResponse(
                events=[
                    ppb.AuditEvent(
                        id=e.id,
                        event_time=timestamp(e.event_time),
                        actor=e.actor,
                        method=e.method,
                        target=e.target,
                        request_json=json.dumps(e.request_fields, sort_keys=True),
                    )
                    for e in page.items
                ],
                next_page_token=page.next_page_token,
            )

    async def CreateTenant(
        self, request: ppb.CreateTenantRequest, context: ServicerContext
    ) -> ppb.CreateTenantResponse:
        async with abort_on_mesh_error(context):
            spec = request.tenant
            tenant = await self._book.create_tenant(
                spec.name,
                spec.zone,
                tier_from_proto(spec.tier),
                rpm_limit=spec.rpm_limit,
                tpm_limit=spec.tpm_limit,
                monthly_token_quota=spec.monthly_token_quota,
                allowed_models=tuple(spec.allowed_models),
                conversation_retention_days=spec.conversation_retention_days,
                memory_enabled=spec.memory_enabled,
            )
            await self._audit.record("CreateTenant", tenant.id, request)
            return ppb.CreateTenantResponse(tenant=tenant_to_proto(tenant))

    async def GetTenant(
        self, request: ppb.GetTenantRequest, context: ServicerContext
    ) -> ppb.GetTenantResponse:
        async with abort_on_mesh_error(context):
            tenant = await self._book.get_tenant(request.tenant)
            return ppb.GetTenantResponse(tenant=tenant_to_proto(tenant))

    async def ListTenants(
        self, request: ppb.ListTenantsRequest, context: ServicerContext
    ) -> ppb.ListTenantsResponse:
        async with abort_on_mesh_error(context):
            page = await self._book.list_tenants(request.page_size, request.page_token, request.zone)
            return ppb.ListTenantsResponse(
                tenants=[tenant_to_proto(t) for t in page.items], next_page_token=page.next_page_token
            )

    async def UpdateTenant(
        self, request: ppb.UpdateTenantRequest, context: ServicerContext
    ) -> ppb.UpdateTenantResponse:
        async with abort_on_mesh_error(context):
            update = tenant_update_from_proto(request.tenant, list(request.update_fields))
            tenant = await self._book.update_tenant(request.tenant.id, update)
            await self._audit.record("UpdateTenant", tenant.id, request)
            return ppb.UpdateTenantResponse(tenant=tenant_to_proto(tenant))

    async def CreateApiKey(
        self, request: ppb.CreateApiKeyRequest, context: ServicerContext
    ) -> ppb.CreateApiKeyResponse:
        async with abort_on_mesh_error(context):
            expire = datetime_of(request.expire_time) if request.HasField("expire_time") else None
            key, secret = await self._book.create_api_key(
                request.tenant, expire_time=expire, secret=request.secret
            )
            await self._audit.record("CreateApiKey", key.id, request)
            return ppb.CreateApiKeyResponse(api_key=api_key_to_proto(key), secret=secret)

    async def RevokeApiKey(
        self, request: ppb.RevokeApiKeyRequest, context: ServicerContext
    ) -> ppb.RevokeApiKeyResponse:
        async with abort_on_mesh_error(context):
            key = await self._book.revoke_api_key(request.key_id)
            await self._audit.record("RevokeApiKey", key.id, request)
            return ppb.RevokeApiKeyResponse(api_key=api_key_to_proto(key))

    async def ListApiKeys(
        self, request: ppb.ListApiKeysRequest, context: ServicerContext
    ) -> ppb.ListApiKeysResponse:
        async with abort_on_mesh_error(context):
            page = await self._book.list_api_keys(request.tenant, request.page_size, request.page_token)
            return ppb.ListApiKeysResponse(
                api_keys=[api_key_to_proto(k) for k in page.items], next_page_token=page.next_page_token
            )

    async def AuthenticateKey(
        self, request: ppb.AuthenticateKeyRequest, context: ServicerContext
    ) -> ppb.AuthenticateKeyResponse:
        async with abort_on_mesh_error(context), global_metrics.policy_lookup("AuthenticateKey"):
            tenant, key_id = await self._book.authenticate(request.secret)
            return ppb.AuthenticateKeyResponse(tenant=tenant_to_proto(tenant), key_id=key_id)

    async def GetPolicySnapshot(
        self, request: ppb.GetPolicySnapshotRequest, context: ServicerContext
    ) -> ppb.GetPolicySnapshotResponse:
        async with abort_on_mesh_error(context), global_metrics.policy_lookup("GetPolicySnapshot") as outcome:
            require_caller((Role.REGION,), f"read the policy of zone {request.zone!r}", zone=request.zone)
            snapshot = await self._book.snapshot(request.zone)
            if request.known_version and request.known_version == snapshot.version:
                outcome("not_modified")
                return ppb.GetPolicySnapshotResponse(not_modified=True)
            return ppb.GetPolicySnapshotResponse(snapshot=snapshot_to_proto(snapshot))
