"""The registry's refusals are remembered as its answers are: a refused
name is asked about once per TTL, not once per request, and a name the
registry starts resolving is served after the next refresh."""

from __future__ import annotations

import asyncio
import contextvars

import grpc
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.core.model_refusals import RefusalCache
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.v1 import common_pb2, model_registry_service_pb2
from tests.common.test_model_resolver import CountingRegistry

pytestmark = pytest.mark.asyncio

REQUEST = contextvars.ContextVar("request", default="")


class WitnessRegistry(CountingRegistry):
    """Records the request context each call runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    async def ResolveModel(
        self, request: model_registry_service_pb2.ResolveModelRequest, **options: float
    ) -> model_registry_service_pb2.ResolveModelResponse:
        self.seen.append(REQUEST.get())
        return await super().ResolveModel(request, **options)


async def test_a_refused_name_is_asked_about_once_per_ttl() -> None:
    now = [0.0]
    registry = CountingRegistry()
    registry.error = grpc.StatusCode.FAILED_PRECONDITION  # retired
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        for _ in range(5):
            with pytest.raises(MeshError) as refused:
                await resolver.resolve("old", common_pb2.TIER_PRO)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert registry.calls == 1
        # Refused again with a fresh error each time: no traceback grows.
        first, second = [await _refusal(resolver) for _ in range(2)]
        assert first is not second
        # The tier is part of the question.
        with pytest.raises(MeshError):
            await resolver.resolve("old", common_pb2.TIER_FREE)
        assert registry.calls == 2
    finally:
        await resolver.close()


async def _refusal(resolver: ModelResolver) -> MeshError:
    try:
        await resolver.resolve("old", common_pb2.TIER_PRO)
    except MeshError as err:
        return err
    raise AssertionError("not refused")


async def test_a_name_the_registry_starts_resolving_is_served_after_the_refresh() -> None:
    now = [0.0]
    registry = CountingRegistry()
    registry.error = grpc.StatusCode.NOT_FOUND
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        with pytest.raises(MeshError):
            await resolver.resolve("new", common_pb2.TIER_PRO)
        registry.error = None  # an operator registers it
        now[0] = 10.0  # within half the TTL: still refused from memory
        with pytest.raises(MeshError):
            await resolver.resolve("new", common_pb2.TIER_PRO)
        assert registry.calls == 1
        now[0] = 16.0  # past half: refused now, asked again behind it
        with pytest.raises(MeshError):
            await resolver.resolve("new", common_pb2.TIER_PRO)
        await asyncio.sleep(0)
        assert registry.calls == 2
        assert (await resolver.resolve("new", common_pb2.TIER_PRO)).name == "new-v2"
        assert registry.calls == 2
    finally:
        await resolver.close()


async def test_a_refusal_past_its_ttl_is_asked_about_on_the_request_path() -> None:
    now = [0.0]
    registry = CountingRegistry()
    registry.error = grpc.StatusCode.NOT_FOUND
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        with pytest.raises(MeshError):
            await resolver.resolve("new", common_pb2.TIER_PRO)
        registry.error = None
        now[0] = 31.0  # no request in between: the next one asks, and is answered
        assert (await resolver.resolve("new", common_pb2.TIER_PRO)).name == "new-v2"
    finally:
        await resolver.close()


async def test_background_refreshes_run_outside_the_request_that_started_them() -> None:
    now = [0.0]
    registry = WitnessRegistry()
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        token = REQUEST.set("turn-1")
        try:
            await resolver.resolve("m", common_pb2.TIER_PRO)  # waited for: the turn's own call
            now[0] = 20.0
            await resolver.resolve("m", common_pb2.TIER_PRO)  # refreshed behind the turn
            await asyncio.sleep(0)
        finally:
            REQUEST.reset(token)
        assert registry.seen == ["turn-1", ""]
    finally:
        await resolver.close()


async def test_the_refusal_cache_is_bounded() -> None:
    cache = RefusalCache(capacity=2)
    err = grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "no")
    for n in range(3):
        cache.remember(("made-up", n), float(n), err)
    assert len(cache) == 2
    assert cache.age_of(("made-up", 0), 5.0) is None
    assert cache.age_of(("made-up", 2), 5.0) == 3.0
    with pytest.raises(ValueError, match="capacity"):
        RefusalCache(capacity=0)
