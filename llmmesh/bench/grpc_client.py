"""A benchmark client of an engine pod: ``EngineService.Generate`` over one
gRPC channel (every stream multiplexed on one HTTP/2 connection, as the
region gateway talks to a pod)."""

from __future__ import annotations

import time

import grpc
import grpc.aio

from llmmesh.bench.stats import RequestRecord
from llmmesh.bench.workload import ChatRequest
from llmmesh.core.mtls import MeshSecurity, open_secure_channel
from llmmesh.v1 import common_pb2
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

# A proxy from the environment must not sit between the benchmark and a
# pod on localhost.
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


def generate_request(request: ChatRequest, ignore_eos: bool = True) -> pb.GenerateRequest:
    """The ``start`` message of ``request``: greedy, ``ignore_eos`` unless
    told otherwise."""
    return pb.GenerateRequest(
        start=pb.GenerateStart(
            request_id=request.request_id,
            messages=[
                common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content=request.system),
                common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=request.user),
            ],
            sampling=common_pb2.SamplingParams(
                max_tokens=request.max_tokens, temperature=0.0, ignore_eos=ignore_eos
            ),
        )
    )


class EngineGrpcClient:
    """Streams generations from the pod at ``address`` (``host:port``).
    Each call is bounded by ``request_timeout_s`` (a gRPC deadline);
    ``ignore_eos`` is sent with every request. The channel is plaintext
    unless ``security`` is mTLS, then it expects the pod to answer to
    ``server_name``."""

    def __init__(
        self,
        address: str,
        request_timeout_s: float,
        ignore_eos: bool = True,
        security: MeshSecurity | None = None,
        server_name: str = "",
    ) -> None:
        self._ignore_eos = ignore_eos
        if security is not None and security.enabled:
            self._channel = open_secure_channel(address, security, server_name, _CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub: pb_grpc.EngineServiceAsyncStub = pb_grpc.EngineServiceStub(self._channel)  # type: ignore[assignment]
        self._timeout_s = request_timeout_s

    async def generate(self, request: ChatRequest) -> RequestRecord:
        """See :class:`llmmesh.bench.loadgen.StreamingClient`. A stream that
        ends without ``finished`` is a failure."""
        record = RequestRecord(sent_at=time.perf_counter())
        call = self._stub.Generate(timeout=self._timeout_s)
        try:
            await call.write(generate_request(request, self._ignore_eos))
            await call.done_writing()
            async for response in call:
                kind = response.WhichOneof("event")
                if kind == "delta":
                    record.add_tokens(time.perf_counter(), len(response.delta.token_ids))
                elif kind == "finished":
                    record.finish(time.perf_counter())
        except grpc.aio.AioRpcError as err:
            record.fail(f"{err.code().name}: {err.details()}")
        if record.finished_at is None:
            record.fail("the stream ended without a finished event")
        return record

    async def close(self) -> None:
        await self._channel.close()
