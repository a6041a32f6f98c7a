"""Running an engine pod: in-process (:func:`start_engine`, for tests and the
embedded mesh) or as its own process (:func:`serve`, behind ``llmmesh engine``)."""

from __future__ import annotations

import logging

import grpc.aio

from engine.backend import EngineBackend
from engine.servicer import SERVICE_NAME, EngineServicer
from engine.settings import EngineSettings
from engine.sim.backend import SimBackend
from llmmesh import lifecycle
from llmmesh.grpcserver import GrpcServer
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class BackendNotAvailable(RuntimeError):
    """The configured backend cannot run in this build."""


def create_backend(settings: EngineSettings) -> EngineBackend:
    """The backend ``settings.backend`` names; raises BackendNotAvailable for
    one this build does not have."""
    if settings.backend == "sim":
        return SimBackend(settings)
    raise BackendNotAvailable(
        f"the {settings.backend!r} engine backend is not installed or implemented yet; "
        "run the pod with --backend sim"
    )


class EnginePod:
    """A serving engine pod: its address, its backend and how to stop it."""

    def __init__(
        self, address: str, pod_id: str, backend: EngineBackend, server: GrpcServer, servicer: EngineServicer
    ) -> None:
        self.address = address
        self.pod_id = pod_id
        self.backend = backend
        self._server = server
        self._servicer = servicer

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain: end the feeds, refuse new calls, give running generations
        ``grace_s`` to finish (then cancel them), and close the backend."""
        self._servicer.drain()
        try:
            await self._server.stop(grace_s)
        finally:
            await self.backend.close()


async def start_engine(settings: EngineSettings) -> EnginePod:
    """Start a backend and its gRPC server (with health and reflection)."""
    backend = create_backend(settings)
    await backend.start()
    servicer = EngineServicer(backend, settings.load_interval_ms)

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_EngineServiceServicer_to_server(servicer, server)

    server = GrpcServer(register, [SERVICE_NAME], settings.host, settings.port)
    try:
        address = await server.start()
    except BaseException:
        await backend.close()
        raise
    return EnginePod(address, settings.pod_id, backend, server, servicer)


async def serve(settings: EngineSettings) -> None:
    """Serve until SIGTERM or SIGINT, then drain. Writes ``settings.ready_file``
    once the server answers."""
    stop = lifecycle.stop_event()
    pod = await start_engine(settings)
    try:
        lifecycle.write_ready_file(
            settings.ready_file,
            {
                "address": pod.address,
                "pod_id": pod.pod_id,
                "backend": settings.backend,
                "model": settings.model,
            },
        )
        log.info(
            "engine pod %s (%s, model %s) serving on %s",
            pod.pod_id,
            settings.backend,
            settings.model,
            pod.address,
        )
        await stop.wait()
        log.info("engine pod %s draining", pod.pod_id)
    finally:
        await pod.stop()
