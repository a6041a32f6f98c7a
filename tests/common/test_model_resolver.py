"""ModelResolver against a real global plane, before and after it goes away."""

from __future__ import annotations

import grpc
import pytest

from globalplane.server import start_global_plane
from globalplane.settings import GlobalSettings
from llmmesh.errors import MeshError
from llmmesh.grpcserver import open_channel
from llmmesh.model_resolver import ModelResolver
from llmmesh.v1 import common_pb2, model_registry_service_pb2_grpc

pytestmark = pytest.mark.asyncio


async def test_cached_answers_outlive_the_registry() -> None:
    now = [0.0]
    plane = await start_global_plane(GlobalSettings(database_url="sqlite://"))
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
