"""The zone's policy snapshot, pulled from the global plane and cached.

Requests are authenticated against the cached snapshot, so the region keeps
serving while the global plane is down, for at most ``max_staleness_s``.
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

    @property
    def version(self) -> int:
        return self._snapshot.version if self._snapshot else 0

    async def refresh(self) -> bool:
        """Fetch a newer snapshot if there is one; False when unreachable."""
        try:
            resp = await self._stub.GetPolicySnapshot(
                policy_service_pb2.GetPolicySnapshotRequest(zone=self._zone, known_version=self.version),
                timeout=5.0,
            )
        except grpc.aio.AioRpcError as err:
            log.warning("policy refresh failed: %s", err.code().name)
            return False
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

    def tenants(self) -> list[policy_service_pb2.Tenant]:
        """The zone's tenants in the cached snapshot (none before the first)."""
        return list(self._tenants.values())

    def tenant(self, tenant_id: str) -> policy_service_pb2.Tenant | None:
        """One tenant of the cached snapshot."""
        return self._tenants.get(tenant_id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="policy-refresh")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
