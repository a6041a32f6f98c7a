"""The tenant book: tenants, their API keys and the policy version regions sync on.

In memory for now; the public methods are coroutines so that a SQL-backed
book can replace this one without touching the servicers.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TypeVar

from globalplane.clock import Clock, utc_now
from globalplane.paging import Page, paginate
from globalplane.policy_records import ApiKey, PolicySnapshot, Tenant, TenantUpdate
from globalplane.tiers import TenantTier, require_zone
from llmmesh import apikeys
from llmmesh.errors import AlreadyExists, InvalidArgument, NotFound, Reason, Unauthenticated
from llmmesh.ids import new_id

T = TypeVar("T")

_MAX_NAME = 128
_LIMIT_FIELDS = ("rpm_limit", "tpm_limit", "monthly_token_quota")


def _require_limit(field: str, value: int) -> None:
    if value < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"{field} must be >= 0 (0 means unlimited)", metadata={"param": field}
        )


def _or(new: T | None, old: T) -> T:
    return old if new is None else new


def _require_name(name: str) -> str:
    if not name.strip() or name != name.strip() or len(name) > _MAX_NAME:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"tenant name must be 1..{_MAX_NAME} characters without surrounding spaces",
            metadata={"param": "name"},
        )
    return name


class TenantBook:
    """Tenants and API keys, with a version that increases on every change."""

    def __init__(self, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._tenants: dict[str, Tenant] = {}
        self._keys: dict[str, ApiKey] = {}
        self._key_by_hash: dict[str, str] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """The policy version; any change to a tenant or key increases it."""
        return self._version

    # ------------------------------------------------------------ tenants

    async def create_tenant(
        self,
        name: str,
        zone: str,
        tier: TenantTier | None,
        *,
        rpm_limit: int = 0,
        tpm_limit: int = 0,
        monthly_token_quota: int = 0,
        allowed_models: tuple[str, ...] = (),
    ) -> Tenant:
        """Create a tenant pinned to ``zone``.

        Raises INVALID_ARGUMENT (``param`` in metadata) for an empty name, a
        malformed zone, a missing tier or a negative limit, and ALREADY_EXISTS
        ``TENANT_EXISTS`` when the name is taken.
        """
        _require_name(name)
        require_zone(zone)
        if tier is None:
            raise InvalidArgument(Reason.INVALID_REQUEST, "tier must be set", metadata={"param": "tier"})
        for field, value in zip(_LIMIT_FIELDS, (rpm_limit, tpm_limit, monthly_token_quota), strict=True):
            _require_limit(field, value)
        if self._by_name(name) is not None:
            raise AlreadyExists(
                Reason.TENANT_EXISTS, f"tenant {name!r} already exists", metadata={"name": name}
            )
        tenant = Tenant(
            id=new_id("ten"),
            name=name,
            zone=zone,
            tier=tier,
            create_time=self._clock(),
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            monthly_token_quota=monthly_token_quota,
            allowed_models=tuple(allowed_models),
        )
        self._tenants[tenant.id] = tenant
        self._version += 1
        return tenant

    async def get_tenant(self, ref: str) -> Tenant:
        """The tenant whose id or name is ``ref``; NOT_FOUND ``TENANT_NOT_FOUND`` otherwise."""
        tenant = self._tenants.get(ref) or self._by_name(ref)
        if tenant is None:
            raise NotFound(Reason.TENANT_NOT_FOUND, f"no tenant {ref!r}", metadata={"tenant": ref})
        return tenant

    async def list_tenants(self, page_size: int = 0, page_token: str = "", zone: str = "") -> Page[Tenant]:
        """Tenants ordered by name, optionally only those of ``zone``."""
        if zone:
            require_zone(zone)
        tenants = [t for t in self._tenants.values() if not zone or t.zone == zone]
        return paginate(tenants, lambda t: t.name, page_size, page_token)

    async def update_tenant(self, ref: str, update: TenantUpdate) -> Tenant:
        """Apply ``update`` to the tenant ``ref``.

        A tenant never changes zone: an update naming another zone is
        INVALID_ARGUMENT ``WRONG_ZONE`` (naming the same zone is a no-op).
        """
        tenant = await self.get_tenant(ref)
        if update.zone is not None and update.zone != tenant.zone:
            raise InvalidArgument(
                Reason.WRONG_ZONE,
                f"tenant {tenant.name!r} is pinned to zone {tenant.zone!r}; its zone cannot change",
                metadata={"param": "zone", "zone": tenant.zone},
            )
        name = tenant.name
        if update.name is not None and update.name != tenant.name:
            _require_name(update.name)
            if self._by_name(update.name) is not None:
                raise AlreadyExists(Reason.TENANT_EXISTS, f"tenant {update.name!r} already exists")
            name = update.name
        for field in _LIMIT_FIELDS:
            limit: int | None = getattr(update, field)
            if limit is not None:
                _require_limit(field, limit)
        updated = dataclasses.replace(
            tenant,
            name=name,
            tier=_or(update.tier, tenant.tier),
            rpm_limit=_or(update.rpm_limit, tenant.rpm_limit),
            tpm_limit=_or(update.tpm_limit, tenant.tpm_limit),
            monthly_token_quota=_or(update.monthly_token_quota, tenant.monthly_token_quota),
            allowed_models=_or(update.allowed_models, tenant.allowed_models),
        )
        if updated == tenant:
            return tenant
        self._tenants[tenant.id] = updated
        self._version += 1
        return updated

    # ------------------------------------------------------------ API keys

    async def create_api_key(
        self, tenant_ref: str, *, expire_time: datetime | None = None, secret: str = ""
    ) -> tuple[ApiKey, str]:
        """Create a key for a tenant; returns it with its secret, shown only now.

        ``secret`` empty lets the server choose one; a chosen secret (for
        development meshes) must not already belong to a key.
        """
        tenant = await self.get_tenant(tenant_ref)
        now = self._clock()
        if expire_time is not None and expire_time <= now:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "expire_time must be in the future", metadata={"param": "expire_time"}
            )
        secret = secret or apikeys.new_secret()
        digest = apikeys.hash_secret(secret)
        if digest in self._key_by_hash:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "that secret is already in use", metadata={"param": "secret"}
            )
        key = ApiKey(
            id=new_id("key"),
            tenant_id=tenant.id,
            display_prefix=apikeys.display_prefix(secret),
            secret_sha256=digest,
            create_time=now,
            expire_time=expire_time,
        )
        self._keys[key.id] = key
        self._key_by_hash[digest] = key.id
        self._version += 1
        return key, secret

    async def revoke_api_key(self, key_id: str) -> ApiKey:
        """Revoke a key; revoking it again returns it unchanged. NOT_FOUND ``KEY_NOT_FOUND``."""
        key = self._keys.get(key_id)
        if key is None:
            raise NotFound(Reason.KEY_NOT_FOUND, f"no API key {key_id!r}", metadata={"key_id": key_id})
        if key.revoke_time is not None:
            return key
        revoked = dataclasses.replace(key, revoke_time=self._clock())
        self._keys[key_id] = revoked
        self._version += 1
        return revoked

    async def list_api_keys(self, tenant_ref: str, page_size: int = 0, page_token: str = "") -> Page[ApiKey]:
        """A tenant's keys, revoked and expired ones included, ordered by id."""
        tenant = await self.get_tenant(tenant_ref)
        keys = [k for k in self._keys.values() if k.tenant_id == tenant.id]
        return paginate(keys, lambda k: k.id, page_size, page_token)

    async def authenticate(self, secret: str) -> tuple[Tenant, str]:
        """The tenant owning ``secret`` and the key's id.

        UNAUTHENTICATED with ``API_KEY_MISSING`` (empty), ``API_KEY_INVALID``
        (unknown), ``API_KEY_REVOKED`` or ``API_KEY_EXPIRED``.
        """
        if not secret:
            raise Unauthenticated(Reason.API_KEY_MISSING, "no API key given")
        key_id = self._key_by_hash.get(apikeys.hash_secret(secret))
        if key_id is None:
            raise Unauthenticated(Reason.API_KEY_INVALID, "invalid API key")
        key = self._keys[key_id]
        if key.revoke_time is not None:
            raise Unauthenticated(Reason.API_KEY_REVOKED, "API key revoked", metadata={"key_id": key.id})
        if key.expired_at(self._clock()):
            raise Unauthenticated(Reason.API_KEY_EXPIRED, "API key expired", metadata={"key_id": key.id})
        return self._tenants[key.tenant_id], key.id

    # ------------------------------------------------------------ snapshots

    async def snapshot(self, zone: str) -> PolicySnapshot:
        """The tenants of ``zone`` and all their keys, at the current version.

        The version is global: a change in another zone moves it too, which
        costs a region one needless refresh but never a stale policy.
        """
        require_zone(zone)
        tenants = tuple(sorted((t for t in self._tenants.values() if t.zone == zone), key=lambda t: t.name))
        ids = {t.id for t in tenants}
        keys = tuple(sorted((k for k in self._keys.values() if k.tenant_id in ids), key=lambda k: k.id))
        return PolicySnapshot(self._version, zone, tenants, keys, self._clock())

    def _by_name(self, name: str) -> Tenant | None:
        return next((t for t in self._tenants.values() if t.name == name), None)
