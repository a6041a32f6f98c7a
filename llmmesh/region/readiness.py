"""The region's readiness: its zone store runs a statement, and its policy
snapshot is within ``policy_max_staleness_ms`` (the region serves on the
cached policy while the global plane is away, and refuses turns only past
that). While either is down the region's services report NOT_SERVING on
grpc.health.v1 (kubelet's readiness probe and Envoy's health check ask
``llmmesh.v1.ChatService``) and the server-wide status stays SERVING
(liveness).

The zone's Redis, when it has one, is checked and reported too, but not
required: without it the region counts rate limits in its own process and
places without the shared KV index (:mod:`region.admission.ratelimit_redis`),
so taking every replica of the zone out of service for it would turn that
degradation into an outage. Rules and reporting are :mod:`llmmesh.core.readiness`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio
import redis.exceptions

from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.readiness import DependencyCheck, ReadinessWatch
from llmmesh.core.sqlstore import SqlStore
from llmmesh.region.policy_cache import PolicyCache


def region_readiness(
    server: GrpcServer, redis_client: redis.asyncio.Redis | None, store: SqlStore, policy: PolicyCache
) -> ReadinessWatch:
    """The region's watch; it sets ``server``'s services' health."""
    checks: list[DependencyCheck] = []
    if redis_client is not None:
        # redis-py types ping() for its sync and async clients at once.
        ping: Callable[[], Any] = redis_client.ping

        async def redis_up() -> str:
            try:
                await ping()
            except redis.exceptions.RedisError as err:
                return f"the zone's Redis does not answer: {err}"
            return ""

        checks.append(DependencyCheck("redis", redis_up, required=False))

    async def zone_store() -> str:
        await store.ping()
        return ""

    async def global_plane() -> str:
        return policy.staleness()

    checks += [DependencyCheck("zone_store", zone_store), DependencyCheck("global_plane", global_plane)]
    return ReadinessWatch("region", checks, on_change=server.set_ready)
