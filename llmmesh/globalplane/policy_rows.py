"""Policy records as rows of the global store, and the row-level steps every policy write shares."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.errors import NotFound, Reason
from llmmesh.globalplane import schema
from llmmesh.globalplane.policy_records import ApiKey, Tenant
from llmmesh.globalplane.tiers import TenantTier


def tenant_of(row: sa.Row[Any]) -> Tenant:
    """A ``tenants`` row as a record."""
    return Tenant(
        id=row.id,
        name=row.name,
        zone=row.zone,
        tier=TenantTier(row.tier),
        create_time=row.create_time,
        rpm_limit=row.rpm_limit,
        tpm_limit=row.tpm_limit,
        monthly_token_quota=row.monthly_token_quota,
        allowed_models=tuple(row.allowed_models),
        conversation_retention_days=row.conversation_retention_days,
        memory_enabled=bool(row.memory_enabled),
        max_files=row.max_files,
        max_vector_stores=row.max_vector_stores,
        max_memories_per_user=row.max_memories_per_user,
        background_tokens_per_day=row.background_tokens_per_day,
        delete_time=row.delete_time,
    )


def key_of(row: sa.Row[Any]) -> ApiKey:
    """An ``api_keys`` row as a record."""
    return ApiKey(
        id=row.id,
        tenant_id=row.tenant_id,
        display_prefix=row.display_prefix,
        secret_sha256=row.secret_sha256,
        create_time=row.create_time,
        expire_time=row.expire_time,
        revoke_time=row.revoke_time,
    )


def find_tenant(conn: Connection, ref: str) -> Tenant:
    """The tenant whose id (preferred) or name is ``ref``; NOT_FOUND ``TENANT_NOT_FOUND`` otherwise."""
    t = schema.tenants
    rows = conn.execute(sa.select(t).where(sa.or_(t.c.id == ref, t.c.name == ref))).all()
    row = next((r for r in rows if r.id == ref), rows[0] if rows else None)
    if row is None:
        raise NotFound(Reason.TENANT_NOT_FOUND, f"no tenant {ref!r}", metadata={"tenant": ref})
    return tenant_of(row)


def bump_version(conn: Connection) -> None:
    """Increase the policy version; call in the transaction of every tenant or key change."""
    v = schema.policy_version
    conn.execute(sa.update(v).where(v.c.id == 1).values(version=v.c.version + 1))


def tenant_row(tenant: Tenant) -> dict[str, object]:
    """A tenant as ``tenants`` column values."""
    return {
        "id": tenant.id,
        "name": tenant.name,
        "zone": tenant.zone,
        "tier": tenant.tier.value,
        "rpm_limit": tenant.rpm_limit,
        "tpm_limit": tenant.tpm_limit,
        "monthly_token_quota": tenant.monthly_token_quota,
        "allowed_models": list(tenant.allowed_models),
        "create_time": tenant.create_time,
        "conversation_retention_days": tenant.conversation_retention_days,
        "memory_enabled": tenant.memory_enabled,
        "max_files": tenant.max_files,
        "max_vector_stores": tenant.max_vector_stores,
        "max_memories_per_user": tenant.max_memories_per_user,
        "background_tokens_per_day": tenant.background_tokens_per_day,
        "delete_time": tenant.delete_time,
    }


def key_row(key: ApiKey) -> dict[str, object]:
    """A key as ``api_keys`` column values."""
    return {
        "id": key.id,
        "tenant_id": key.tenant_id,
        "display_prefix": key.display_prefix,
        "secret_sha256": key.secret_sha256,
        "create_time": key.create_time,
        "expire_time": key.expire_time,
        "revoke_time": key.revoke_time,
    }
