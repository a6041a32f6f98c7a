"""The tenant book: tenants, their API keys and the policy version regions sync on.

Backed by the global store: each public method is one transaction, and every
change to a tenant or key bumps the policy version in that same transaction.
Only the SHA-256 of a key's secret is stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core import apikeys
from llmmesh.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Reason,
    Unauthenticated,
)
from llmmesh.core.ids import new_id
from llmmesh.globalplane import schema
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.paging import Page, page_of, page_window
from llmmesh.globalplane.policy_records import ApiKey, PolicySnapshot, Tenant, TenantUpdate
from llmmesh.globalplane.policy_rows import bump_version, find_tenant, key_of, key_row, tenant_of, tenant_row
from llmmesh.globalplane.store import GlobalStore
from llmmesh.globalplane.tiers import TenantTier, require_zone

T = TypeVar("T")

_MAX_NAME = 128
_LIMIT_FIELDS = ("rpm_limit", "tpm_limit", "monthly_token_quota")


def _require_limit(field: str, value: int) -> None:
    if value < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"{field} must be >= 0 (0 means unlimited)", metadata={"param": field}
        )


def _require_retention(days: int) -> None:
    if not 0 <= days <= _MAX_RETENTION_DAYS:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"conversation_retention_days must be 0 (the region's default) to {_MAX_RETENTION_DAYS}",
            metadata={"param": "conversation_retention_days"},
        )


_MAX_RETENTION_DAYS = 3650

_CAP_FIELDS = ("max_files", "max_vector_stores", "max_memories_per_user")
_MAX_CAP = 1_000_000
_MAX_BACKGROUND_TOKENS = 10**12


def _require_background_tokens(tokens: int) -> None:
    if not 0 <= tokens <= _MAX_BACKGROUND_TOKENS:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"background_tokens_per_day must be 0 (the region's default) to {_MAX_BACKGROUND_TOKENS}",
            metadata={"param": "background_tokens_per_day"},
        )


def _require_cap(field: str, cap: int) -> None:
    if not 0 <= cap <= _MAX_CAP:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{field} must be 0 (the region's default) to {_MAX_CAP}",
            metadata={"param": field},
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


def _name_taken(conn: Connection, name: str) -> bool:
    t = schema.tenants
    return conn.execute(sa.select(t.c.id).where(t.c.name == name)).first() is not None


def _tenant_exists(name: str) -> AlreadyExists:
    return AlreadyExists(Reason.TENANT_EXISTS, f"tenant {name!r} already exists", metadata={"name": name})


def _require_live(tenant: Tenant, change: str) -> Tenant:
    """FAILED_PRECONDITION ``TENANT_DELETED`` when ``tenant`` was deleted."""
    if tenant.delete_time is not None:
        raise FailedPrecondition(
            Reason.TENANT_DELETED,
            f"tenant {tenant.name!r} was deleted at {tenant.delete_time.isoformat()}; cannot {change}",
            metadata={"tenant": tenant.id},
        )
    return tenant


class TenantBook:
    """Tenants and API keys, with a version that increases on every change."""

    def __init__(self, store: GlobalStore, clock: Clock = utc_now) -> None:
        self._store = store
        self._clock = clock
        self._zones: dict[str, str] = {}

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
        conversation_retention_days: int = 0,
        memory_enabled: bool = False,
        max_files: int = 0,
        max_vector_stores: int = 0,
        max_memories_per_user: int = 0,
        background_tokens_per_day: int = 0,
    ) -> Tenant:
        """Create a tenant pinned to ``zone``.

        Raises INVALID_ARGUMENT (``param`` in metadata) for an empty name, a
        malformed zone, a missing tier or a negative limit, and ALREADY_EXISTS
        ``TENANT_EXISTS`` when the name is taken (also when two creations race).
        """
        _require_name(name)
        require_zone(zone)
        if tier is None:
            raise InvalidArgument(Reason.INVALID_REQUEST, "tier must be set", metadata={"param": "tier"})
        for field, value in zip(_LIMIT_FIELDS, (rpm_limit, tpm_limit, monthly_token_quota), strict=True):
            _require_limit(field, value)
        _require_retention(conversation_retention_days)
        for field, cap in zip(
            _CAP_FIELDS, (max_files, max_vector_stores, max_memories_per_user), strict=True
        ):
            _require_cap(field, cap)
        _require_background_tokens(background_tokens_per_day)
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
            conversation_retention_days=conversation_retention_days,
            memory_enabled=memory_enabled,
            max_files=max_files,
            max_vector_stores=max_vector_stores,
            max_memories_per_user=max_memories_per_user,
            background_tokens_per_day=background_tokens_per_day,
        )

        def create(conn: Connection) -> Tenant:
            t = schema.tenants
            taken = conn.execute(sa.select(t.c.delete_time).where(t.c.name == name)).first()
            if taken is not None and taken.delete_time is not None:
                raise AlreadyExists(
                    Reason.TENANT_EXISTS,
                    f"tenant {name!r} was deleted, and a deleted tenant's name stays taken "
                    "(its usage records keep it): choose another name",
                    metadata={"name": name},
                )
            if taken is not None:
                raise _tenant_exists(name)
            conn.execute(sa.insert(schema.tenants).values(tenant_row(tenant)))
            bump_version(conn)
            return tenant

        try:
            return await self._store.transaction(create)
        except sa.exc.IntegrityError:
            raise _tenant_exists(name) from None

    async def get_tenant(self, ref: str) -> Tenant:
        """The tenant whose id or name is ``ref``, deleted or not (its
        ``delete_time`` says); NOT_FOUND ``TENANT_NOT_FOUND`` otherwise."""
        return await self._store.transaction(lambda conn: find_tenant(conn, ref))

    async def delete_tenant(self, ref: str) -> tuple[Tenant, int]:
        """Delete the tenant ``ref``: mark it deleted and revoke its active
        keys, in one transaction that bumps the policy version. Returns it
        and how many keys this revoked; deleting it again returns it
        unchanged with 0. Its row stays (usage records refer to it) and its
        name stays taken. NOT_FOUND ``TENANT_NOT_FOUND``."""
        now = self._clock()

        def delete(conn: Connection) -> tuple[Tenant, int]:
            tenant = find_tenant(conn, ref)
            if tenant.delete_time is not None:
                return tenant, 0
            t, k = schema.tenants, schema.api_keys
            conn.execute(sa.update(t).where(t.c.id == tenant.id).values(delete_time=now))
            active = sa.and_(k.c.tenant_id == tenant.id, k.c.revoke_time.is_(None))
            revoked = conn.execute(sa.update(k).where(active).values(revoke_time=now)).rowcount
            bump_version(conn)
            return find_tenant(conn, tenant.id), int(revoked)

        return await self._store.transaction(delete)

    async def zone_of(self, ref: str) -> str:
        """The zone of the tenant whose id or name is ``ref``; NOT_FOUND ``TENANT_NOT_FOUND`` otherwise.

        Routing asks this on every request, so an id answers from memory
        after its first lookup. That can never go stale, whichever process
        changes the book: a tenant's zone never changes, tenants are never
        deleted and ids are never reused. A name can come to mean another
        tenant (renames), so a name is looked up every time.
        """
        zone = self._zones.get(ref)
        if zone is None:
            tenant = await self.get_tenant(ref)
            self._zones[tenant.id] = zone = tenant.zone
        return zone

    async def list_tenants(self, page_size: int = 0, page_token: str = "", zone: str = "") -> Page[Tenant]:
        """Tenants that exist (not deleted), ordered by name, optionally only those of ``zone``."""
        if zone:
            require_zone(zone)
        after, size = page_window(page_size, page_token)
        t = schema.tenants
        query = sa.select(t).where(t.c.delete_time.is_(None)).order_by(t.c.name).limit(size + 1)
        if zone:
            query = query.where(t.c.zone == zone)
        if after is not None:
            query = query.where(t.c.name > after)
        rows = await self._store.transaction(lambda conn: conn.execute(query).all())
        return page_of([tenant_of(r) for r in rows], lambda t: t.name, size)

    async def update_tenant(self, ref: str, update: TenantUpdate) -> Tenant:
        """Apply ``update`` to the tenant ``ref``.

        A tenant never changes zone: an update naming another zone is
        INVALID_ARGUMENT ``WRONG_ZONE`` (naming the same zone is a no-op).
        """
        for field in _LIMIT_FIELDS:
            limit: int | None = getattr(update, field)
            if limit is not None:
                _require_limit(field, limit)
        if update.conversation_retention_days is not None:
            _require_retention(update.conversation_retention_days)
        for field in _CAP_FIELDS:
            cap: int | None = getattr(update, field)
            if cap is not None:
                _require_cap(field, cap)
        if update.background_tokens_per_day is not None:
            _require_background_tokens(update.background_tokens_per_day)
        if update.name is not None:
            _require_name(update.name)

        def apply(conn: Connection) -> Tenant:
            tenant = _require_live(find_tenant(conn, ref), "change it")
            if update.zone is not None and update.zone != tenant.zone:
                raise InvalidArgument(
                    Reason.WRONG_ZONE,
                    f"tenant {tenant.name!r} is pinned to zone {tenant.zone!r}; its zone cannot change",
                    metadata={"param": "zone", "zone": tenant.zone},
                )
            if update.name is not None and update.name != tenant.name and _name_taken(conn, update.name):
                raise _tenant_exists(update.name)
            updated = Tenant(
                id=tenant.id,
                name=_or(update.name, tenant.name),
                zone=tenant.zone,
                tier=_or(update.tier, tenant.tier),
                create_time=tenant.create_time,
                rpm_limit=_or(update.rpm_limit, tenant.rpm_limit),
                tpm_limit=_or(update.tpm_limit, tenant.tpm_limit),
                monthly_token_quota=_or(update.monthly_token_quota, tenant.monthly_token_quota),
                allowed_models=_or(update.allowed_models, tenant.allowed_models),
                conversation_retention_days=_or(
                    update.conversation_retention_days, tenant.conversation_retention_days
                ),
                memory_enabled=_or(update.memory_enabled, tenant.memory_enabled),
                max_files=_or(update.max_files, tenant.max_files),
                max_vector_stores=_or(update.max_vector_stores, tenant.max_vector_stores),
                max_memories_per_user=_or(update.max_memories_per_user, tenant.max_memories_per_user),
                background_tokens_per_day=_or(
                    update.background_tokens_per_day, tenant.background_tokens_per_day
                ),
                delete_time=tenant.delete_time,
            )
            if updated == tenant:
                return tenant
            t = schema.tenants
            conn.execute(sa.update(t).where(t.c.id == tenant.id).values(tenant_row(updated)))
            bump_version(conn)
            return updated

        try:
            return await self._store.transaction(apply)
        except sa.exc.IntegrityError:
            raise _tenant_exists(update.name or ref) from None

    # ------------------------------------------------------------ API keys

    async def create_api_key(
        self, tenant_ref: str, *, expire_time: datetime | None = None, secret: str = ""
    ) -> tuple[ApiKey, str]:
        """Create a key for a tenant; returns it with its secret, shown only now.

        ``secret`` empty lets the server choose one; a chosen secret (for
        development meshes) must not already belong to a key.
        """
        now = self._clock()
        if expire_time is not None and expire_time <= now:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "expire_time must be in the future", metadata={"param": "expire_time"}
            )
        secret = secret or apikeys.new_secret()
        digest = apikeys.hash_secret(secret)
        in_use = InvalidArgument(
            Reason.INVALID_REQUEST, "that secret is already in use", metadata={"param": "secret"}
        )

        def create(conn: Connection) -> ApiKey:
            tenant = _require_live(find_tenant(conn, tenant_ref), "give it a key")
            k = schema.api_keys
            if conn.execute(sa.select(k.c.id).where(k.c.secret_sha256 == digest)).first() is not None:
                raise in_use
            key = ApiKey(
                id=new_id("key"),
                tenant_id=tenant.id,
                display_prefix=apikeys.display_prefix(secret),
                secret_sha256=digest,
                create_time=now,
                expire_time=expire_time,
            )
            conn.execute(sa.insert(k).values(key_row(key)))
            bump_version(conn)
            return key

        try:
            return await self._store.transaction(create), secret
        except sa.exc.IntegrityError:
            raise in_use from None

    async def revoke_api_key(self, key_id: str) -> ApiKey:
        """Revoke a key; revoking it again returns it unchanged. NOT_FOUND ``KEY_NOT_FOUND``."""
        now = self._clock()

        def revoke(conn: Connection) -> ApiKey:
            k = schema.api_keys
            row = conn.execute(sa.select(k).where(k.c.id == key_id)).first()
            if row is None:
                raise NotFound(Reason.KEY_NOT_FOUND, f"no API key {key_id!r}", metadata={"key_id": key_id})
            key = key_of(row)
            if key.revoke_time is not None:
                return key
            # The guard keeps the first revocation time when two revocations race.
            done = conn.execute(
                sa.update(k).where(k.c.id == key_id, k.c.revoke_time.is_(None)).values(revoke_time=now)
            )
            if done.rowcount:
                bump_version(conn)
            return key_of(conn.execute(sa.select(k).where(k.c.id == key_id)).one())

        return await self._store.transaction(revoke)

    async def list_api_keys(self, tenant_ref: str, page_size: int = 0, page_token: str = "") -> Page[ApiKey]:
        """A tenant's keys, revoked and expired ones included, ordered by id."""
        after, size = page_window(page_size, page_token)

        def listing(conn: Connection) -> list[ApiKey]:
            tenant = find_tenant(conn, tenant_ref)
            k = schema.api_keys
            query = sa.select(k).where(k.c.tenant_id == tenant.id).order_by(k.c.id).limit(size + 1)
            if after is not None:
                query = query.where(k.c.id > after)
            return [key_of(r) for r in conn.execute(query)]

        return page_of(await self._store.transaction(listing), lambda k: k.id, size)

    async def authenticate(self, secret: str) -> tuple[Tenant, str]:
        """The tenant owning ``secret`` and the key's id.

        UNAUTHENTICATED with ``API_KEY_MISSING`` (empty), ``API_KEY_INVALID``
        (unknown), ``API_KEY_REVOKED`` or ``API_KEY_EXPIRED``.
        """
        if not secret:
            raise Unauthenticated(Reason.API_KEY_MISSING, "no API key given")
        digest = apikeys.hash_secret(secret)

        def lookup(conn: Connection) -> tuple[ApiKey, Tenant] | None:
            k = schema.api_keys
            row = conn.execute(sa.select(k).where(k.c.secret_sha256 == digest)).first()
            if row is None:
                return None
            return key_of(row), find_tenant(conn, row.tenant_id)

        found = await self._store.transaction(lookup)
        if found is None:
            raise Unauthenticated(Reason.API_KEY_INVALID, "invalid API key")
        key, tenant = found
        if key.revoke_time is not None or tenant.delete_time is not None:
            raise Unauthenticated(Reason.API_KEY_REVOKED, "API key revoked", metadata={"key_id": key.id})
        if key.expired_at(self._clock()):
            raise Unauthenticated(Reason.API_KEY_EXPIRED, "API key expired", metadata={"key_id": key.id})
        return tenant, key.id

    # ------------------------------------------------------------ snapshots

    async def snapshot(self, zone: str) -> PolicySnapshot:
        """The tenants of ``zone`` and all their keys, at the current version.

        A deleted tenant is left out, its keys stay in (revoked, so a region
        answers ``API_KEY_REVOKED``), and its id is listed in
        ``deleted_tenant_ids`` for the regions to purge its zone-bound data.

        The version is global: a change in another zone moves it too, which
        costs a region one needless refresh but never a stale policy. It is
        read before the tenants and keys, so under concurrent writes a
        snapshot may be newer than its version says (the region refreshes
        again), never older.
        """
        require_zone(zone)

        def read(conn: Connection) -> tuple[int, list[Tenant], list[ApiKey]]:
            v, t, k = schema.policy_version, schema.tenants, schema.api_keys
            version = conn.execute(sa.select(v.c.version).where(v.c.id == 1)).scalar_one()
            tenants = [tenant_of(r) for r in conn.execute(sa.select(t).where(t.c.zone == zone))]
            keys = conn.execute(
                sa.select(k).join(t, t.c.id == k.c.tenant_id).where(t.c.zone == zone).order_by(k.c.id)
            )
            return version, tenants, [key_of(r) for r in keys]

        version, tenants, keys = await self._store.transaction(read)
        ordered = tuple(sorted((t for t in tenants if t.delete_time is None), key=lambda t: t.name))
        deleted = tuple(sorted(t.id for t in tenants if t.delete_time is not None))
        return PolicySnapshot(version, zone, ordered, tuple(keys), self._clock(), deleted)
