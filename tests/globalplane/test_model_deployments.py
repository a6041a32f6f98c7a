"""The registry's deployments of each model come from the pods per model
that regions count in their heartbeats: a region running two pods of one
model and one of another says so, and a pod going down is counted as down.
In process, on real gRPC servers: a global plane, simulator pods, a region."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal

import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod
from llmmesh.globalplane.model_catalog import Model, ModelDeployment, ModelTier
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.heartbeat import model_pods
from llmmesh.region.server import RegionPlane
from llmmesh.v1 import model_registry_service_pb2 as mpb
from llmmesh.v1 import model_registry_service_pb2_grpc
from tests.stack import MeshBuilder, region_settings, wait_until

SMALL, LARGE = "llmmesh-small", "llmmesh-large"


@pytest.mark.asyncio
async def test_model_pods_counts_each_model_s_pods_and_the_healthy_ones() -> None:
    pool = EnginePool([f"127.0.0.1:{9 + n}" for n in range(4)])
    try:
        for n, (pod, name, up) in enumerate(
            zip(pool.pods, [SMALL, SMALL, LARGE, ""], [True, False, True, False], strict=True)
        ):
            pod.pod_id, pod.model, pod.healthy = f"pod-{n}", name, up
        counted = model_pods(pool.pods, {"embedder": [pool.pods[2]]})
    finally:
        await pool.close()
    assert [(m.model, m.engine_pods, m.healthy_engine_pods) for m in counted] == [
        ("embedder", 1, 1),
        (LARGE, 1, 1),
        (SMALL, 2, 1),
    ]


@dataclass
class Mesh:
    glob: GlobalPlane
    pods: list[EnginePod]
    region: RegionPlane


@pytest_asyncio.fixture
async def mesh() -> AsyncIterator[Mesh]:
    async with MeshBuilder() as build:
        glob = await build.global_plane(heartbeat_interval_ms=100)
        for name, tier in ((SMALL, ModelTier.SMALL), (LARGE, ModelTier.LARGE)):
            await glob.catalog.upsert_model(Model(name, tier, 4096, Decimal("0.001"), Decimal("0.002")))
        pods = [
            await build.pod(f"us-east-pod-{n}", model=name) for n, name in enumerate((SMALL, SMALL, LARGE))
        ]
        region = await build.region(region_settings(glob.address, pods, heartbeat_interval_ms=100))
        await wait_until(lambda: len(region.pool.healthy_pods) == 3, what="the region knows its pods")
        yield Mesh(glob, pods, region)


async def deployments(channel: grpc.aio.Channel, name: str) -> list[tuple[str, int]]:
    stub = model_registry_service_pb2_grpc.ModelRegistryServiceStub(channel)
    model = (await stub.GetModel(mpb.GetModelRequest(name=name))).model
    return [(d.region, d.engine_pods) for d in model.deployments]


@pytest.mark.asyncio
async def test_the_registry_lists_each_model_with_its_own_pods(mesh: Mesh) -> None:
    async def counted() -> bool:
        small = await mesh.glob.catalog.get_model(SMALL)
        return small.deployments == (ModelDeployment("us-east", 2),)

    for _ in range(100):
        if await counted():
            break
        await mesh.region.heartbeat.beat()
    async with open_channel(mesh.glob.address) as channel:
        assert await deployments(channel, SMALL) == [("us-east", 2)]
        assert await deployments(channel, LARGE) == [("us-east", 1)]
    # A stopped pod stays deployed (down), and the heartbeat says so.
    await mesh.pods[0].stop(0)
    await mesh.region.pool.check()
    report = mesh.region.report()
    by_model = {m.model: (m.engine_pods, m.healthy_engine_pods) for m in report.model_pods}
    # Every simulator pod also embeds: its embedding model runs on all three.
    assert mesh.region.embedding_pods is not None
    embedding = dict.fromkeys(mesh.region.embedding_pods.models, (3, 2))
    assert embedding
    assert by_model == {SMALL: (2, 1), LARGE: (1, 1), **embedding}
