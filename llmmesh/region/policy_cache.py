"""The zone's policy snapshot, pulled from the global plane and cached.

Requests are authenticated against the cached snapshot, so the region keeps
serving while the global plane is down, for at most ``max_staleness_s``.
A key the snapshot does not know is not refused at once: the region asks
for a newer snapshot first (:meth:`PolicyCache.authenticate_fresh`), so a
key made a moment ago works on its first request. Revocations reach the
region with the next snapshot, within the refresh interval. Those asks are
bounded: an unknown key is asked about at most once per
``UNKNOWN_KEY_RECHECK_S``, and the region asks the global plane at most once
per ``FORCED_REFRESH_GAP_S`` whatever the keys, concurrent misses sharing
one ask.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from llmmesh.core import apikeys
from llmmesh.core.errors import Reason, Unauthenticated, Unavailable
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.v1 import common_pb2, policy_service_pb2, policy_service_pb2_grpc

log = logging.getLogger(__name__)

UNKNOWN_KEY_RECHECK_S = 5.0
"""How long a key that a fresh snapshot did not know is refused without asking again."""
FORCED_REFRESH_GAP_S = 0.25
"""The least time between two snapshot fetches an unknown key causes."""
FORCED_REFRESH_TIMEOUT_S = 1.0
"""How long an unknown key's request waits for that fetch before it is refused."""
UNKNOWN_KEYS_KEPT = 10_000
"""Most unknown keys remembered; the oldest are forgotten first."""


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the tenant behind a key."""

    tenant: policy_service_pb2.Tenant
    key_id: str

    @property
    def tenant_id(self) -> str:
        return self.tenant.id

    @property
    def tier(self) -> common_pb2.Tier.ValueType:
        return self.tenant.tier


class PolicyCache:
    """Holds the latest policy snapshot of one zone and refreshes it."""

    def __init__(
        self,
        stub: policy_service_pb2_grpc.PolicyServiceStub,
        zone: str,
        refresh_s: float,
        max_staleness_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._stub = stub
        self._zone = zone
        self._refresh_s = refresh_s
        self._max_staleness_s = max_staleness_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._snapshot: policy_service_pb2.PolicySnapshot | None = None
        self._fetched_at = 0.0
        self._keys: dict[str, policy_service_pb2.KeyRecord] = {}
        self._tenants: dict[str, policy_service_pb2.Tenant] = {}
        self._task: asyncio.Task[None] | None = None
        # Digest of an unknown key -> when a fresh snapshot last did not know it.
        self._unknown: dict[str, float] = {}
        self._forced: asyncio.Task[bool] | None = None
        self._forced_at = -FORCED_REFRESH_GAP_S
        # Whether the last fetch reached the global plane; while not, unknown keys wait for no fetch.
        self._reachable = True

    @property
    def version(self) -> int:
        return self._snapshot.version if self._snapshot else 0

    def staleness(self) -> str:
        """``""`` while the snapshot is young enough to authenticate with, else
        why not: what the region's readiness reports of the global plane."""
        if self._snapshot is None:
            return "no policy snapshot yet: the global plane has not answered"
        age_s = self._clock() - self._fetched_at
        if age_s <= self._max_staleness_s:
            return ""
        return (
            f"unreachable: the policy snapshot is {age_s:.0f} s old, past the "
            f"{self._max_staleness_s:g} s the region serves on it"
        )

    async def refresh(self, timeout_s: float = 5.0) -> bool:
        """Fetch a newer snapshot if there is one; False when unreachable."""
        try:
            resp = await self._stub.GetPolicySnapshot(
                policy_service_pb2.GetPolicySnapshotRequest(zone=self._zone, known_version=self.version),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as err:
            log.warning("policy refresh failed: %s", err.code().name)
            self._reachable = False
            return False
        self._reachable = True
        self._fetched_at = self._clock()
        if not resp.not_modified:
            self._install(resp.snapshot)
        return True

    def _install(self, snapshot: policy_service_pb2.PolicySnapshot) -> None:
        self._snapshot = snapshot
        self._tenants = {t.id: t for t in snapshot.tenants}
        self._keys = {k.secret_sha256: k for k in snapshot.keys}
        log.info(
            "policy snapshot v%d: %d tenants, %d keys", snapshot.version, len(self._tenants), len(self._keys)
        )

    def authenticate(self, secret: str | None) -> Caller:
        """The caller behind ``secret``; raises Unauthenticated or Unavailable."""
        if not secret:
            raise Unauthenticated(
                Reason.API_KEY_MISSING, "missing API key: send 'authorization: Bearer <key>'"
            )
        if self._snapshot is None or self._clock() - self._fetched_at > self._max_staleness_s:
            raise Unavailable(
                Reason.GLOBAL_PLANE_UNAVAILABLE,
                "the region has no current policy snapshot; the global plane is unreachable",
                retry_after_s=self._refresh_s,
            )
        record = self._keys.get(apikeys.hash_secret(secret))
        if record is None:
            raise Unauthenticated(Reason.API_KEY_INVALID, "invalid API key")
        if record.revoked:
            raise Unauthenticated(Reason.API_KEY_REVOKED, "this API key has been revoked")
        if record.HasField("expire_time") and record.expire_time.ToSeconds() <= self._wall_clock():
            raise Unauthenticated(Reason.API_KEY_EXPIRED, "this API key has expired")
        tenant = self._tenants.get(record.tenant_id)
        if tenant is None:
            raise Unauthenticated(Reason.API_KEY_INVALID, "invalid API key")
        return Caller(tenant=tenant, key_id=record.key_id)

    async def authenticate_fresh(self, secret: str | None) -> Caller:
        """:meth:`authenticate`; for a key the snapshot does not know, after
        fetching a newer snapshot (bounded, see the module docstring)."""
        try:
            return self.authenticate(secret)
        except Unauthenticated as err:
            if err.reason != Reason.API_KEY_INVALID or not secret:
                raise
            digest = apikeys.hash_secret(secret)
            now = self._clock()
            if now - self._unknown.get(digest, -UNKNOWN_KEY_RECHECK_S) < UNKNOWN_KEY_RECHECK_S:
                raise
            await self._refresh_for_unknown_key()
            try:
                return self.authenticate(secret)
            except Unauthenticated:
                self._remember_unknown(digest)
                raise

    async def _refresh_for_unknown_key(self) -> None:
        """One snapshot fetch that concurrent misses share, at most once per gap."""
        if self._forced is None or self._forced.done():
            if not self._reachable or self._clock() - self._forced_at < FORCED_REFRESH_GAP_S:
                return
            self._forced_at = self._clock()
            self._forced = asyncio.create_task(
                self.refresh(timeout_s=FORCED_REFRESH_TIMEOUT_S), name="policy-refresh-for-a-new-key"
            )
        await asyncio.shield(self._forced)

    def _remember_unknown(self, digest: str) -> None:
        self._unknown[digest] = self._clock()
        while len(self._unknown) > UNKNOWN_KEYS_KEPT:
            del self._unknown[next(iter(self._unknown))]

    def tenants(self) -> list[policy_service_pb2.Tenant]:
        """The zone's tenants in the cached snapshot (none before the first)."""
        return list(self._tenants.values())

    def tenant(self, tenant_id: str) -> policy_service_pb2.Tenant | None:
        """One tenant of the cached snapshot."""
        return self._tenants.get(tenant_id)

    def deleted_tenant_ids(self) -> list[str]:
        """The zone's deleted tenants in the cached snapshot, whose zone-bound data is purged."""
        return list(self._snapshot.deleted_tenant_ids) if self._snapshot is not None else []

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="policy-refresh")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._forced)
