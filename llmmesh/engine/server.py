"""Running an engine pod: in-process (:func:`start_engine`, for tests and the
embedded mesh) or as its own process (:func:`serve`, behind ``llmmesh engine``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc.aio

from llmmesh.core import lifecycle
from llmmesh.core.access import AccessPolicy
from llmmesh.core.addresses import advertised_address, advertised_url, check_advertisable
from llmmesh.core.grpcserver import GrpcServer
from llmmesh.core.identity import Role
from llmmesh.engine.backend import EngineBackend
from llmmesh.engine.embedding import Embedder
from llmmesh.engine.embedding_pod import add_embedding_service, start_embedder
from llmmesh.engine.embedding_servicer import EMBEDDING_SERVICE_NAME
from llmmesh.engine.hop_metrics import EngineHopMetrics, pod_registry
from llmmesh.engine.metrics_endpoint import MetricsEndpoint
from llmmesh.engine.servicer import SERVICE_NAME, EngineServicer
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.engine.sim.faults import exit_process
from llmmesh.engine.tiny_model import resolve_model_dir
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


# Only the region that owns a pod (its certificate names the pod's zone and
# region) drives it: generation and embedding run only for a region, which
# meters, queues and bills them. An operator's admin certificate may look
# at a pod (its description, load, KV events, tokenizer), never make it work.
_PODS_REGION = (Role.REGION,)
_LOOKS = (Role.REGION, Role.ADMIN)
ENGINE_ACCESS = {
    **dict.fromkeys(("Generate", "GenerateSession", "CancelGeneration", "Embed"), _PODS_REGION),
    **dict.fromkeys(
        (
            "Tokenize",
            "GetTokenizer",
            "GetEngineInfo",
            "GetLoad",
            "WatchLoad",
            "StreamKvEvents",
            "GetEmbeddingInfo",
        ),
        _LOOKS,
    ),
}


class BackendNotAvailable(ValueError):
    """The configured backend cannot run in this build."""


def create_backend(settings: EngineSettings, on_crash: Callable[[], None] | None = None) -> EngineBackend:
    """The backend ``settings.backend`` names; raises BackendNotAvailable for
    one this build does not have. ``on_crash`` is what the simulator's
    injected crash (``sim_crash_after_generations``) calls; it is required
    when that fault is set (ValueError otherwise)."""
    if settings.backend == "sim":
        return SimBackend(settings, on_crash)
    if settings.backend == "vllm":
        # The model first: a wrong path fails in milliseconds, not after
        # importing torch.
        model_dir = resolve_model_dir(settings.model_path)
        try:
            from llmmesh.engine.vllm_engine.backend import VllmBackend
        except ImportError as exc:
            raise BackendNotAvailable(
                f"the vllm backend needs vLLM ({exc}); install it with "
                "`pip install -e '.[vllm]'` or run the pod with --backend sim"
            ) from exc
        return VllmBackend(settings, model_dir)
    raise BackendNotAvailable(f"no engine backend {settings.backend!r}; use sim or vllm")


class EnginePod:
    """A serving engine pod: its address, its backend and how to stop it."""

    def __init__(
        self,
        address: str,
        pod_id: str,
        backend: EngineBackend,
        server: GrpcServer,
        servicer: EngineServicer,
        metrics: MetricsEndpoint,
        embedder: Embedder | None = None,
    ) -> None:
        self.address = address
        self.pod_id = pod_id
        self.backend = backend
        self.metrics = metrics
        self.embedder = embedder
        self._server = server
        self._servicer = servicer

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drain: end the feeds, refuse new calls, give running generations
        ``grace_s`` to finish (then cancel them), and close the backend."""
        self._servicer.drain()
        try:
            await self._server.stop(grace_s)
        finally:
            self.metrics.stop()
            await self.backend.close()
            if self.embedder is not None:
                await self.embedder.backend.close()


async def start_engine(settings: EngineSettings, on_crash: Callable[[], None] | None = None) -> EnginePod:
    """Start a backend and its gRPC server (with health and reflection).

    ``on_crash`` stands in for the process exit of an injected crash, so an
    in-process pod (tests, the embedded mesh) never kills its host process;
    only :func:`serve` exits."""
    check_advertisable(settings.host, settings.advertise_address, f"engine pod {settings.pod_id}")
    security = settings.mesh_security(f"engine-{settings.pod_id}")
    own = security.expect_role(Role.ENGINE)
    access = AccessPolicy(ENGINE_ACCESS, zone=own.zone, region=own.region) if own else None
    backend = create_backend(settings, on_crash)
    await backend.start()
    hop_metrics = EngineHopMetrics()
    servicer = EngineServicer(backend, settings.load_interval_ms, hop_metrics)
    try:
        embedder = await start_embedder(settings, settings.backend)
    except BaseException:
        await backend.close()
        raise

    async def close_backends() -> None:
        await backend.close()
        if embedder is not None:
            await embedder.backend.close()

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_EngineServiceServicer_to_server(servicer, server)
        if embedder is not None:
            add_embedding_service(server, embedder, settings.pod_id)

    services = [SERVICE_NAME, *([EMBEDDING_SERVICE_NAME] if embedder is not None else [])]
    server = GrpcServer(register, services, settings.host, settings.port, security=security, access=access)
    try:
        registry = pod_registry(backend.prometheus_registry(), hop_metrics.registry)
        metrics = MetricsEndpoint(registry, settings.host, settings.metrics_port)
    except BaseException:
        await close_backends()
        raise
    try:
        bound = await server.start()
        address = advertised_address(bound, settings.advertise_address, f"engine pod {settings.pod_id}")
    except BaseException:
        metrics.stop()
        await close_backends()
        raise
    return EnginePod(address, settings.pod_id, backend, server, servicer, metrics, embedder)


async def serve(settings: EngineSettings) -> None:
    """Serve until SIGTERM or SIGINT, then drain. Writes ``settings.ready_file``
    once the server answers. An injected crash exits the process at once
    with code 70 (:func:`engine.sim.faults.exit_process`)."""
    stop = lifecycle.stop_event()
    pod = await start_engine(settings, on_crash=exit_process)
    try:
        lifecycle.settle_heap()
        lifecycle.write_ready_file(
            settings.ready_file,
            {
                "address": pod.address,
                "metrics_url": advertised_url(pod.metrics.url, pod.address),
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
