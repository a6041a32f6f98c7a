"""Simulator pods for a virtual-time run, and the prompts' tokens.

A :class:`VirtualPod` is a :class:`engine.sim.backend.SimBackend` behind the
real :class:`engine.servicer.EngineServicer` and a health service, reached
through :mod:`llmmesh.bench.inprocess_grpc` at an ``inprocess://`` address.
It reports no GPU, so no machine's GPUs reach its load reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.bench.inprocess_grpc import InProcessServer
from llmmesh.bench.routing_clients import PrefixCacheCounts
from llmmesh.bench.routing_workload import Message
from llmmesh.core.chat_tokenizer import tokenizer_spec
from llmmesh.engine.gpu import GpuTelemetry, NvmlProbe
from llmmesh.engine.servicer import EngineServicer
from llmmesh.engine.settings import EngineSettings
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.tokenizer_client import ChatTokenizer, local_tokenizer
from llmmesh.v1 import engine_service_pb2, engine_service_pb2_grpc


class _NoGpu(NvmlProbe):
    """A simulated pod has no GPU: its reports carry none, on any machine."""

    def read(self) -> GpuTelemetry:
        return GpuTelemetry(available=False, unavailable_reason="a simulated pod")


class _AlwaysServing(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: object
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@dataclass
class VirtualPod:
    """A simulator pod behind its real servicer, reachable in process."""

    address: str
    backend: SimBackend
    server: InProcessServer

    def prefix_counts(self) -> PrefixCacheCounts:
        load = self.backend.load()
        return PrefixCacheCounts(float(load.prefix_cache_queries), float(load.prefix_cache_hits))


def virtual_pod(settings: EngineSettings) -> VirtualPod:
    """A simulator pod of ``settings``, reporting no GPU."""
    backend = SimBackend(settings, gpu=_NoGpu())
    server = InProcessServer()
    engine_service_pb2_grpc.add_EngineServiceServicer_to_server(
        EngineServicer(backend, settings.load_interval_ms), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(_AlwaysServing(), server)
    return VirtualPod(f"inprocess://{settings.pod_id}", backend, server)


class PromptTokens:
    """Prompt token ids as the region's local tokenizer renders them
    (:func:`region.tokenizer_client.local_tokenizer` of the pods' published
    tokenizer), each distinct message encoded once: the simulator's chat
    template renders a prompt as BOS, each message on its own, then the
    assistant opener, so a prompt is the concatenation of its messages'
    renderings. The region's :class:`~region.tokenizer_client.TokenizerClient`
    does this work per turn; a virtual run counts no time for it either way,
    and at thousands of users it would dominate the run's own cost."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._head = tokenizer.render_chat([], False)
        self._opener = tokenizer.render_chat([], True)[len(self._head) :]
        self._messages: dict[tuple[str, str], list[int]] = {}

    @classmethod
    async def of(cls, pool: EnginePool, model: str) -> PromptTokens:
        """From the tokenizer a pod of ``pool`` publishes."""
        pod = pool.healthy_pods[0]
        response = await pod.stub.GetTokenizer(engine_service_pb2.GetTokenizerRequest(model=model))
        tokenizer = local_tokenizer(tokenizer_spec(response))
        if tokenizer is None:
            raise ValueError(f"the pods of {model} publish no tokenizer the region can run")
        return cls(tokenizer)

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        ids = list(self._head)
        for message in messages:
            encoded = self._messages.get(message)
            if encoded is None:
                encoded = self._tokenizer.render_chat([message], False)[len(self._head) :]
                self._messages[message] = encoded
            ids += encoded
        return ids + self._opener
