"""Model resolution through ModelRegistryService, cached per name and tier.

A cached answer keeps a plane serving known models while the registry is
unreachable; only a never-seen name needs the global plane. An answer past
half its time to live is used and refreshed in the background
(:mod:`llmmesh.core.refresh`), so steady traffic never waits on the registry. An
answer past its TTL but younger than ``stale_s`` is used the same way
(stale-while-revalidate): what a name means changes only when an operator
changes the registry, so the first turn after an idle spell need not wait
for it; a name the refresh finds gone is refused from the next turn on.
A refusal (unknown, retired, not for the tier) is remembered the same way
(:mod:`llmmesh.core.model_refusals`), and refreshes run outside the request's
trace. Requests that find a name unknown or too old at the same time wait for one
call, not one each. :meth:`ModelResolver.forget_all` drops every answer
when the registry says its catalog changed (a region hears so in its
heartbeat answers), so a retired model is refused from the next turn on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import grpc.aio

from llmmesh.core.errors import Reason, Unavailable, from_rpc_error
from llmmesh.core.model_refusals import RefusalCache, detached
from llmmesh.core.outage import PROBE_TIMEOUT_S, OutageGate
from llmmesh.core.refresh import SingleFlight, refresh_due
from llmmesh.v1 import common_pb2, model_registry_service_pb2, model_registry_service_pb2_grpc

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ModelResolver:
    """Resolves requested model names ("auto" included) for a tenant tier."""

    def __init__(
        self,
        stub: model_registry_service_pb2_grpc.ModelRegistryServiceStub,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        stale_s: float = 300.0,
    ) -> None:
        if not stale_s >= ttl_s:
            raise ValueError("stale_s must be at least ttl_s")
        self._stub = stub
        self._ttl_s = ttl_s
        self._stale_s = stale_s
        self._clock = clock
        self._cache: dict[tuple[str, int], tuple[float, model_registry_service_pb2.Model]] = {}
        self._refusals = RefusalCache()
        self.outage = OutageGate(clock=clock)
        self._refresh: SingleFlight[model_registry_service_pb2.Model] = SingleFlight("model resolver")
        # Bumped by forget_all: an answer asked for before it is not kept.
        self._generation = 0

    async def resolve(self, name: str, tier: common_pb2.Tier.ValueType) -> model_registry_service_pb2.Model:
        """The model ``name`` means for ``tier``; raises the registry's MeshError
        (NOT_FOUND ``UNKNOWN_MODEL``…), or UNAVAILABLE when it cannot be asked
        and nothing is cached."""
        key = (name or "auto", int(tier))
        refused = self._refusals.age_of(key, self._clock())
        if refused is not None and refused < self._ttl_s:
            if refresh_due(refused, self._ttl_s) and not self.outage.down:
                detached(lambda: self._refresh.start(key, lambda: self._ask(key, tier, None)))
            raise self._refusals.error(key)
        hit = self._cache.get(key)
        if hit is not None:
            age = self._clock() - hit[0]
            if age < self._stale_s:
                if refresh_due(age, self._ttl_s) and not self.outage.down:
                    detached(lambda: self._refresh.start(key, lambda: self._ask(key, tier, hit)))
                return hit[1]
        # Requests that find the name unknown or too old together wait for one call.
        return await asyncio.shield(self._refresh.start(key, lambda: self._ask(key, tier, hit)))

    async def _ask(
        self,
        key: tuple[str, int],
        tier: common_pb2.Tier.ValueType,
        hit: tuple[float, model_registry_service_pb2.Model] | None,
    ) -> model_registry_service_pb2.Model:
        """``ResolveModel``, remembered; ``hit`` while the registry is
        unreachable. A name the registry no longer resolves is forgotten."""
        if hit is not None and self.outage.skip():
            return hit[1]
        generation = self._generation
        try:
            resp = await self._stub.ResolveModel(
                model_registry_service_pb2.ResolveModelRequest(name=key[0], tenant_tier=tier),
                timeout=PROBE_TIMEOUT_S if hit is not None else 5.0,
            )
        except grpc.aio.AioRpcError as err:
            if err.code() not in _UNREACHABLE:
                self._cache.pop(key, None)
                if generation == self._generation:
                    self._refusals.remember(key, self._clock(), err)
                raise from_rpc_error(err) from err
            self.outage.failed()
            if hit is not None:
                return hit[1]
            raise Unavailable(
                Reason.GLOBAL_PLANE_UNAVAILABLE, "the model registry is unreachable", retry_after_s=1.0
            ) from err
        self.outage.answered()
        model: model_registry_service_pb2.Model = resp.model
        self._refusals.forget(key)
        if generation == self._generation:
            self._cache[key] = (self._clock(), model)
        return model

    def forget_all(self) -> None:
        """Drop every cached answer and refusal: the next request for each
        name asks the registry (the catalog changed)."""
        self._generation += 1
        self._cache.clear()
        self._refusals.clear()

    async def close(self) -> None:
        """Cancel the background refreshes still running."""
        await self._refresh.close()
