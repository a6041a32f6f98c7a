"""The edge's memory of keys and routes: reused for a moment, and kept in use
(for a bounded time) while the global plane is unreachable."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from llmmesh.core.errors import MeshError, Reason
from llmmesh.edge.mesh_client import MeshClient, RouteOptions
from llmmesh.v1 import geo_routing_service_pb2, policy_service_pb2

pytestmark = pytest.mark.asyncio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def unreachable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connection refused"
    )


class FakeGlobal:
    """Answers AuthenticateKey and Route until ``down`` is set; a key's
    answer takes ``latency_s`` when one is set."""

    def __init__(self) -> None:
        self.down = False
        self.revoked = False
        self.calls = 0
        self.latency_s = 0.0

    async def AuthenticateKey(
        self, request: policy_service_pb2.AuthenticateKeyRequest, **options: float
    ) -> policy_service_pb2.AuthenticateKeyResponse:
        self.calls += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.down:
            raise unreachable()
        if self.revoked:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(), "key revoked"
            )
        return policy_service_pb2.AuthenticateKeyResponse(
            tenant=policy_service_pb2.Tenant(id="t1", name="acme"), key_id="k1"
        )

    async def Route(
        self, request: geo_routing_service_pb2.RouteRequest, **options: float
    ) -> geo_routing_service_pb2.RouteResponse:
        self.calls += 1
        if self.down:
            raise unreachable()
        status = geo_routing_service_pb2.RegionStatus()
        status.report.region = "us-east"
        return geo_routing_service_pb2.RouteResponse(regions=[status])


async def client(clock: Clock) -> tuple[MeshClient, FakeGlobal]:
    mesh = MeshClient(
        "127.0.0.1:1",
        auth_cache_s=5.0,
        clock=clock,
        routes=RouteOptions(cache_s=1.0, stale_s=30.0),
        outage_grace_s=60.0,
    )
    fake = FakeGlobal()
    mesh.policy = fake  # type: ignore[assignment]
    mesh.geo = fake  # type: ignore[assignment]
    return mesh, fake


async def test_a_route_is_reused_for_its_ttl_and_forgotten_with_a_failed_region() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    try:
        await mesh.route("t1", "m")
        await mesh.route("t1", "m")
        assert fake.calls == 1
        mesh.forget_region("us-east")
        await mesh.route("t1", "m")
        assert fake.calls == 2
        clock.now += 1.5  # past the TTL, inside the stale bound: used, and asked again behind it
        await mesh.route("t1", "m")
        await asyncio.sleep(0)
        assert fake.calls == 3
        clock.now += 31  # too old to use: asked on the turn's path
        await mesh.route("t1", "m")
        assert fake.calls == 4
    finally:
        await mesh.close()


async def test_keys_and_routes_outlive_a_global_plane_outage_for_the_grace_only() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    try:
        principal = await mesh.authenticate("sk-1")
        assert [r.report.region for r in await mesh.route("t1", "m")] == ["us-east"]
        fake.down = True
        clock.now += 30  # past the key and route caches, inside the grace
        assert (await mesh.authenticate("sk-1")).tenant.id == principal.tenant.id
        assert [r.report.region for r in await mesh.route("t1", "m")] == ["us-east"]
        # A key never seen is not let in on an outage.
        with pytest.raises(MeshError) as err:
            await mesh.authenticate("sk-unknown")
        assert err.value.reason == Reason.GLOBAL_PLANE_UNAVAILABLE
        clock.now += 31  # past the grace
        with pytest.raises(MeshError) as err:
            await mesh.authenticate("sk-1")
        assert err.value.reason == Reason.GLOBAL_PLANE_UNAVAILABLE
        with pytest.raises(MeshError):
            await mesh.route("t1", "m")
        # Back: fresh answers again.
        fake.down = False
        assert (await mesh.authenticate("sk-1")).key_id == "k1"
    finally:
        await mesh.close()


async def test_a_key_past_half_its_ttl_is_used_and_checked_again_in_the_background() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    try:
        await mesh.authenticate("sk-1")
        clock.now += 2.0
        await mesh.authenticate("sk-1")
        assert fake.calls == 1  # young: no call
        clock.now += 1.0  # 3 s of 5: answered from memory, checked in the background
        assert (await mesh.authenticate("sk-1")).key_id == "k1"
        await asyncio.sleep(0)
        assert fake.calls == 2
        clock.now += 4.0  # 7 s after the first check, 4 s after the second: still fresh
        await mesh.authenticate("sk-1")
        await asyncio.sleep(0)
        assert fake.calls == 3  # and past half its time again: one more background check
    finally:
        await mesh.close()


async def test_a_key_revoked_meanwhile_is_refused_on_the_next_request() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    try:
        await mesh.authenticate("sk-1")
        fake.revoked = True
        clock.now += 3.0
        await mesh.authenticate("sk-1")  # from memory; the background check learns of the revocation
        await asyncio.sleep(0)
        with pytest.raises(MeshError) as refused:
            await mesh.authenticate("sk-1")
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await mesh.close()


async def test_requests_that_find_a_key_unknown_or_expired_together_wait_for_one_call() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    fake.latency_s = 0.01
    try:
        first = await asyncio.gather(*(mesh.authenticate("sk-1") for _ in range(8)))
        assert [principal.key_id for principal in first] == ["k1"] * 8
        assert fake.calls == 1
        clock.now += 10.0  # expired: the burst after an idle spell
        await asyncio.gather(*(mesh.authenticate("sk-1") for _ in range(8)))
        assert fake.calls == 2
        fake.revoked = True
        clock.now += 10.0
        burst = (mesh.authenticate("sk-1") for _ in range(4))
        refusals = await asyncio.gather(*burst, return_exceptions=True)
        assert [error.code for error in refusals if isinstance(error, MeshError)] == [
            grpc.StatusCode.UNAUTHENTICATED
        ] * 4
        assert fake.calls == 3
    finally:
        await mesh.close()


async def test_a_caller_that_gives_up_does_not_cancel_the_call_others_wait_for() -> None:
    clock = Clock()
    mesh, fake = await client(clock)
    fake.latency_s = 0.05
    try:
        impatient = asyncio.create_task(mesh.authenticate("sk-1"))
        patient = asyncio.create_task(mesh.authenticate("sk-1"))
        await asyncio.sleep(0.01)
        impatient.cancel()
        assert (await patient).key_id == "k1"
        assert impatient.cancelled()
        assert fake.calls == 1
    finally:
        await mesh.close()
