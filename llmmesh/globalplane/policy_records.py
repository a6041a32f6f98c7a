"""The policy plane's records: tenants, API keys and zone snapshots. No gRPC here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmmesh.globalplane.tiers import TenantTier


@dataclass(frozen=True)
class Tenant:
    """A customer, pinned to one zone for its whole life."""

    id: str
    name: str
    zone: str
    tier: TenantTier
    create_time: datetime
    rpm_limit: int = 0
    """Requests per minute per key; 0 means unlimited."""
    tpm_limit: int = 0
    """Tokens per minute per key; 0 means unlimited."""
    monthly_token_quota: int = 0
    """Tokens per calendar month; 0 means unlimited."""
    allowed_models: tuple[str, ...] = ()
    """Models it may use; empty means all models of its tier."""
    conversation_retention_days: int = 0
    """Days its deleted conversations are kept before their purge; 0 means the region's default."""
    memory_enabled: bool = False
    """Whether facts about its end users are learned from their turns and put in their context."""
    max_files: int = 0
    """Most files it keeps in its zone; 0 means the region's default."""
    max_vector_stores: int = 0
    """Most vector stores it keeps in its zone; 0 means the region's default."""
    max_memories_per_user: int = 0
    """Most facts kept about one of its end users (the oldest go first); 0 means the region's default."""
    background_tokens_per_day: int = 0
    """Most tokens a day (UTC) spent on background work for it (summaries,
    memory extraction); 0 means the region's default."""
    delete_time: datetime | None = None
    """When it was deleted; None while it exists. A deleted tenant keeps its
    row (its usage stays billable) but no key, no snapshot entry, no change."""


@dataclass(frozen=True)
class TenantUpdate:
    """Changes to a tenant; ``None`` leaves a field as it is.

    ``zone`` is here only so that an attempt to move a tenant is refused
    explicitly rather than silently ignored.
    """

    name: str | None = None
    zone: str | None = None
    tier: TenantTier | None = None
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    monthly_token_quota: int | None = None
    allowed_models: tuple[str, ...] | None = None
    conversation_retention_days: int | None = None
    memory_enabled: bool | None = None
    max_files: int | None = None
    max_vector_stores: int | None = None
    max_memories_per_user: int | None = None
    background_tokens_per_day: int | None = None


@dataclass(frozen=True)
class ApiKey:
    """An API key. Only the hash of its secret is ever stored."""

    id: str
    tenant_id: str
    display_prefix: str
    secret_sha256: str
    create_time: datetime
    expire_time: datetime | None = None
    revoke_time: datetime | None = None

    def expired_at(self, now: datetime) -> bool:
        """Whether the key no longer works at ``now`` because it expired."""
        return self.expire_time is not None and now >= self.expire_time


@dataclass(frozen=True)
class PolicySnapshot:
    """Everything a region of ``zone`` needs to authorize requests offline."""

    version: int
    zone: str
    tenants: tuple[Tenant, ...]
    keys: tuple[ApiKey, ...]
    create_time: datetime
    deleted_tenant_ids: tuple[str, ...] = ()
    """The zone's deleted tenants, whose zone-bound data its regions purge."""
