"""The probe port: an mTLS plane also answers grpc.health.v1, and nothing
else, in plaintext on ``probe_port``, for kubelet's gRPC probes (which speak
no TLS); it reports the plane's own health, a drain included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from llmmesh.bench.processes import free_port
from llmmesh.core.access import AccessPolicy
from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import TlsSetupError
from llmmesh.globalplane.settings import GlobalSettings
from llmmesh.topology.mesh_certs import ensure_mesh_certs

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[GrpcServer, int]]:
    """A server on mTLS with a global-plane certificate and a probe port."""
    files = ensure_mesh_certs(tmp_path / "certs", [PlaneIdentity(Role.GLOBAL, "global")])["global"]
    probe_port = free_port()
    settings = GlobalSettings(
        tls_cert=str(files.cert), tls_key=str(files.key), tls_ca=str(files.ca), probe_port=probe_port
    )
    security = settings.mesh_security("global")
    assert security.enabled
    services = ["llmmesh.v1.PolicyService"]
    server = GrpcServer(lambda _: None, services, security=security, access=AccessPolicy({}))
    await server.start()
    try:
        yield server, probe_port
    finally:
        await server.stop(0)


async def _status(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        status: int = reply.status
        return status


@pytest.mark.asyncio
async def test_the_probe_port_reports_the_plane_s_health_in_plaintext(
    secured: tuple[GrpcServer, int],
) -> None:
    server, probe_port = secured
    assert await _status(probe_port) == SERVING
    assert await _status(probe_port, "llmmesh.v1.PolicyService") == SERVING
    await server.set_serving(False)
    assert await _status(probe_port) == NOT_SERVING


@pytest.mark.asyncio
async def test_the_probe_port_serves_health_alone_and_the_plane_port_stays_mtls(
    secured: tuple[GrpcServer, int],
) -> None:
    server, probe_port = secured
    async with grpc.aio.insecure_channel(f"127.0.0.1:{probe_port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.ServerReflectionInfo(iter([request]), timeout=5):
                pass
        assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    plane_port = int(server.address.rsplit(":", 1)[1])
    with pytest.raises(grpc.aio.AioRpcError) as plaintext:
        await _status(plane_port)
    assert plaintext.value.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_a_drain_stops_the_probe_port_too(secured: tuple[GrpcServer, int]) -> None:
    server, probe_port = secured
    await server.stop(0)
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await _status(probe_port)
    assert gone.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_probe_port_out_of_range_is_refused() -> None:
    with pytest.raises(TlsSetupError, match="probe_port"):
        GlobalSettings(insecure=True, probe_port=70000).mesh_security("global")


def test_no_probe_port_by_default() -> None:
    assert GlobalSettings(insecure=True).mesh_security("global").probe_port == 0
