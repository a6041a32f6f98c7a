"""Readiness follows the dependencies a plane needs: with the zone's Redis
unreachable the edge (whose streams go on without resumability meanwhile)
and the region (which counts rate limits in its own process meanwhile)
report Redis down, and why, but stay ready; with the
global plane gone past each plane's grace, both turn unready. Liveness (the
edge's port, the region's server-wide health) stays up throughout, so
Kubernetes restarts neither for a dependency outage."""

from __future__ import annotations

import asyncio

import grpc.aio
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.bench.processes import free_port
from llmmesh.region.server import SERVICE_NAME, RegionPlane
from tests.stack import MeshBuilder, region_settings, wait_until

pytestmark = pytest.mark.asyncio

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(region: RegionPlane, service: str) -> int:
    async with grpc.aio.insecure_channel(region.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        status: int = reply.status
        return status


async def test_an_unreachable_redis_leaves_edge_and_region_ready_but_degraded() -> None:
    # Nothing listens there: every connection is refused at once.
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        pods = await build.pods("us-east", 1)
        region = await build.region(region_settings(glob.address, pods, redis_url=redis_url))
        edge = await build.edge(glob.address, redis_url=redis_url)
        async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
            resp = await http.get("/readyz")
            assert resp.status_code == 200
            body = resp.json()
            assert body["status"] == "ok"
            redis = body["dependencies"]["redis"]
            assert redis["up"] is False and redis["required"] is False
            assert "Redis" in redis["reason"]
            assert body["dependencies"]["global_plane"] == {"up": True, "required": True, "reason": ""}
            metrics = (await http.get("/metrics")).text
            assert 'llmmesh_dependency_up{dependency="redis",plane="edge"} 0.0' in metrics

        report = await region.links.readiness.check()
        assert report.reasons[0].startswith("redis: the zone's Redis does not answer")
        assert report.ready
        assert await _health(region, SERVICE_NAME) == SERVING


async def test_the_global_plane_gone_past_the_grace_makes_edge_and_region_unready() -> None:
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        pods = await build.pods("us-east", 1)
        region = await build.region(region_settings(glob.address, pods, policy_max_staleness_ms=1000))
        edge = await build.edge(glob.address, global_outage_grace_s=0.5)
        await build.stop(glob)

        await wait_until(lambda: region.policy.staleness() != "", what="the policy snapshot going stale")
        report = await region.links.readiness.check()
        assert not report.ready
        assert report.reasons == [f"global_plane: {region.policy.staleness()}"]
        assert await _health(region, SERVICE_NAME) == NOT_SERVING
        assert await _health(region, "") == SERVING

        async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
            async with asyncio.timeout(10):
                while (resp := await http.get("/readyz")).status_code == 200:
                    await asyncio.sleep(0.2)
            assert resp.status_code == 503
            reason = resp.json()["dependencies"]["global_plane"]["reason"]
            assert "past the 0.5 s the plane serves without it" in reason


async def test_without_redis_the_edge_is_ready_on_its_global_plane() -> None:
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        edge = await build.edge(glob.address)
        async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
            resp = await http.get("/readyz")
        assert resp.status_code == 200
        assert resp.json() == {
            "status": "ok",
            "dependencies": {"global_plane": {"up": True, "required": True, "reason": ""}},
        }
