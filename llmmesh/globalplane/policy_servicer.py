"""``PolicyService``: a thin gRPC face on :class:`TenantBook`."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection

from llmmesh.core.access import require_caller
from llmmesh.core.errors import FailedPrecondition, InvalidArgument, Reason
from llmmesh.core.identity import Role
from llmmesh.globalplane import metrics as global_metrics
from llmmesh.globalplane.audit import AuditLog
from llmmesh.globalplane.paging import page_of, page_window
from llmmesh.globalplane.policy_records import ApiKey, PolicySnapshot, Tenant, TenantUpdate
from llmmesh.globalplane.protoconv import (
    datetime_of,
    required_tier,
    tier_from_proto,
    tier_to_proto,
    timestamp,
)
from llmmesh.globalplane.rpc_errors import ServicerContext, abort_on_mesh_error
from llmmesh.globalplane.tenant_book import TenantBook
from llmmesh.globalplane.tiers import require_zone
from llmmesh.v1 import policy_service_pb2 as ppb
from llmmesh.v1 import policy_service_pb2_grpc

SERVICE_NAME = "llmmesh.v1.PolicyService"

ZoneCheck = Callable[[], Collection[str]]
"""The zones a tenant may be created in without ``allow_empty_zone``."""
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
        "max_files",
        "max_vector_stores",
        "max_memories_per_user",
        "background_tokens_per_day",
    }
)


def tenant_to_proto(tenant: Tenant) -> ppb.Tenant:
    proto = ppb.Tenant(
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
        max_files=tenant.max_files,
        max_vector_stores=tenant.max_vector_stores,
        max_memories_per_user=tenant.max_memories_per_user,
        background_tokens_per_day=tenant.background_tokens_per_day,
    )
    if tenant.delete_time is not None:
        proto.delete_time.CopyFrom(timestamp(tenant.delete_time))
    return proto


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
        deleted_tenant_ids=snapshot.deleted_tenant_ids,
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
        max_files=tenant.max_files if "max_files" in named else None,
        max_vector_stores=tenant.max_vector_stores if "max_vector_stores" in named else None,
        max_memories_per_user=tenant.max_memories_per_user if "max_memories_per_user" in named else None,
        background_tokens_per_day=(
            tenant.background_tokens_per_day if "background_tokens_per_day" in named else None
        ),
    )


# Method names are the RPC names the generated base class declares (hence N802).
class PolicyServicer(policy_service_pb2_grpc.PolicyServiceServicer):
    """Tenants, API keys and zone policy snapshots."""

    def __init__(self, book: TenantBook, audit: AuditLog, zones: ZoneCheck | None = None) -> None:
        """``zones``, when given, names the zones a tenant may be created in
        (unless its request allows an empty zone); None accepts any zone."""
        self._book = book
        self._audit = audit
        self._zones = zones

    def _require_known_zone(self, request: ppb.CreateTenantRequest) -> None:
        """FAILED_PRECONDITION ``ZONE_UNKNOWN`` for a zone no region serves
        and the topology does not name: its tenant's turns could never run."""
        zone = request.tenant.zone
        if self._zones is None or request.allow_empty_zone:
            return
        require_zone(zone)
        known = sorted(self._zones())
        if zone in known:
            return
        raise FailedPrecondition(
            Reason.ZONE_UNKNOWN,
            f"zone {zone!r} has no regions: the mesh's zones are {', '.join(known) or 'none'}; "
            "create the tenant in one of them, or allow an empty zone (allow_empty_zone, "
            "llmmesh admin tenant create --allow-empty-zone) when its regions come later",
            metadata={"param": "zone", "zone": zone, "zones": ",".join(known)},
        )

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
            self._require_known_zone(request)
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
                max_files=spec.max_files,
                max_vector_stores=spec.max_vector_stores,
                max_memories_per_user=spec.max_memories_per_user,
                background_tokens_per_day=spec.background_tokens_per_day,
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

    async def DeleteTenant(
        self, request: ppb.DeleteTenantRequest, context: ServicerContext
    ) -> ppb.DeleteTenantResponse:
        async with abort_on_mesh_error(context):
            tenant, revoked = await self._book.delete_tenant(request.tenant)
            await self._audit.record("DeleteTenant", tenant.id, request)
            return ppb.DeleteTenantResponse(tenant=tenant_to_proto(tenant), revoked_keys=revoked)

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
