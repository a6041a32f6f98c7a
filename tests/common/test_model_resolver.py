"""ModelResolver against a real global plane, before and after it goes away."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from llmmesh.core.errors import MeshError
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.globalplane.server import start_global_plane
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.v1 import common_pb2, model_registry_service_pb2, model_registry_service_pb2_grpc

pytestmark = pytest.mark.asyncio


async def test_cached_answers_outlive_the_registry() -> None:
    now = [0.0]
    plane = await start_global_plane(GlobalSettings(database_url="sqlite://", insecure=True))
    async with open_channel(plane.address) as channel:
        resolver = ModelResolver(
            model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel), ttl_s=30, clock=lambda: now[0]
        )
        model = await resolver.resolve("auto", common_pb2.TIER_PRO)
        assert model.name == "llmmesh-tiny"
        with pytest.raises(MeshError) as unknown:
            await resolver.resolve("no-such-model", common_pb2.TIER_PRO)
        assert (unknown.value.code, unknown.value.reason) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_MODEL")

        await plane.stop(0)
        now[0] = 60.0  # past the TTL: the registry must be asked, and cannot be
        assert (await resolver.resolve("auto", common_pb2.TIER_PRO)).name == "llmmesh-tiny"
        with pytest.raises(MeshError) as unreachable:
            await resolver.resolve("auto", common_pb2.TIER_FREE)
        assert (unreachable.value.code, unreachable.value.reason) == (
            grpc.StatusCode.UNAVAILABLE,
            "GLOBAL_PLANE_UNAVAILABLE",
        )


class CountingRegistry:
    """Resolves every name to a model of that name, counting calls; fails
    with ``error`` when one is set; an answer takes ``latency_s`` when one
    is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.error: grpc.StatusCode | None = None
        self.latency_s = 0.0

    async def ResolveModel(
        self, request: model_registry_service_pb2.ResolveModelRequest, **options: float
    ) -> model_registry_service_pb2.ResolveModelResponse:
        self.calls += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.error is not None:
            raise grpc.aio.AioRpcError(self.error, grpc.aio.Metadata(), grpc.aio.Metadata(), "no")
        return model_registry_service_pb2.ResolveModelResponse(
            model=model_registry_service_pb2.Model(name=f"{request.name}-v{self.calls}")
        )


async def test_an_answer_past_half_its_ttl_is_used_and_refreshed_in_the_background() -> None:
    now = [0.0]
    registry = CountingRegistry()
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        now[0] = 10.0
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        assert registry.calls == 1
        now[0] = 20.0  # past half: the old answer now, a fresh one behind it
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        await asyncio.sleep(0)
        assert registry.calls == 2
        now[0] = 40.0  # past the first answer's TTL, not the refreshed one's
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v2"
        assert registry.calls == 2
    finally:
        await resolver.close()


async def test_a_model_the_registry_stops_resolving_is_forgotten() -> None:
    now = [0.0]
    registry = CountingRegistry()
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        await resolver.resolve("m", common_pb2.TIER_PRO)
        registry.error = grpc.StatusCode.NOT_FOUND
        now[0] = 16.0
        await resolver.resolve("m", common_pb2.TIER_PRO)  # from memory; the refresh learns it is gone
        await asyncio.sleep(0)
        with pytest.raises(MeshError) as gone:
            await resolver.resolve("m", common_pb2.TIER_PRO)
        assert gone.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        await resolver.close()


async def test_requests_that_find_a_name_unknown_or_too_old_together_wait_for_one_call() -> None:
    now = [0.0]
    registry = CountingRegistry()
    registry.latency_s = 0.01
    resolver = ModelResolver(registry, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        burst = await asyncio.gather(*(resolver.resolve("m", common_pb2.TIER_PRO) for _ in range(8)))
        assert [model.name for model in burst] == ["m-v1"] * 8
        now[0] = 400.0  # too old to use: the burst after a long idle spell
        burst = await asyncio.gather(*(resolver.resolve("m", common_pb2.TIER_PRO) for _ in range(8)))
        assert [model.name for model in burst] == ["m-v2"] * 8
        # Another tier is another question: its own call.
        await asyncio.gather(*(resolver.resolve("m", common_pb2.TIER_FREE) for _ in range(4)))
        assert registry.calls == 3
    finally:
        await resolver.close()


async def test_an_answer_past_its_ttl_is_used_while_refreshed_until_it_is_too_old() -> None:
    now = [0.0]
    registry = CountingRegistry()
    resolver = ModelResolver(registry, ttl_s=30, stale_s=300, clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        registry.latency_s = 0.01
        now[0] = 100.0  # back after an idle spell: answered at once, refreshed behind
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v1"
        await asyncio.sleep(0.05)
        assert registry.calls == 2  # one refresh for both
        assert (await resolver.resolve("m", common_pb2.TIER_PRO)).name == "m-v2"
        with pytest.raises(ValueError, match="stale_s"):
            ModelResolver(registry, ttl_s=30, stale_s=10)  # type: ignore[arg-type]
    finally:
        await resolver.close()
