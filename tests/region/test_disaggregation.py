"""Disaggregated serving through a real region: a prefill pod and a decode
pod (simulators, gRPC, in process). The router places the prefill phase on
the prefill pod and the decode phase on the decode pod with the KV handle;
the client sees one ordinary turn, served and billed by the decode pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from llmmesh.core.grpcserver import open_channel
from llmmesh.engine.server import EnginePod
from llmmesh.engine.sim.backend import SimBackend
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.region.metrics import REGISTRY
from llmmesh.region.placement.disaggregation import phased_pod
from llmmesh.region.server import RegionPlane
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from llmmesh.v1 import engine_service_pb2 as engine_pb
from tests.stack import DEV_KEY, MeshBuilder, region_settings, wait_until

pytestmark = pytest.mark.asyncio

POD = {
    "insecure": True,
    "context_window": 512,
    "sim_inter_token_s": 0.0005,
    "sim_prefill_per_token_s": 0.000001,
    "sim_prefill_overhead_s": 0.0001,
}


@dataclass
class PdMesh:
    global_plane: GlobalPlane
    prefill: EnginePod
    decode: EnginePod
    region: RegionPlane


@pytest_asyncio.fixture
async def mesh() -> AsyncIterator[PdMesh]:
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        prefill = await build.pod("us-east-prefill-0", pod_role="prefill", **POD)
        decode = await build.pod("us-east-decode-0", pod_role="decode", **POD)
        region = await build.region(region_settings(glob.address, [prefill, decode]))
        pool = region.pool
        await wait_until(
            lambda: len(pool.healthy_pods) == 2 and all(p.info.role for p in pool.pods), what="pods known"
        )
        yield PdMesh(glob, prefill, decode, region)


async def chat(address: str, text: str) -> list[chat_service_pb2.ChatResponse]:
    request = chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)],
            sampling=common_pb2.SamplingParams(max_tokens=16, seed=3),
        )
    )
    async with open_channel(address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
            metadata=(("authorization", f"Bearer {DEV_KEY}"),)
        )
        await call.write(request)
        await call.done_writing()
        return [event async for event in call]


def counted(name: str) -> float:
    """A region counter's value (the registry is the process's)."""
    return REGISTRY.get_sample_value(f"llmmesh_region_{name}_total") or 0.0


def backend(pod: EnginePod) -> SimBackend:
    assert isinstance(pod.backend, SimBackend)
    return pod.backend


async def test_a_turn_is_prefilled_on_the_prefill_pod_and_decoded_on_the_decode_pod(mesh: PdMesh) -> None:
    roles = {pod.pod_id: pod.info.role for pod in mesh.region.pool.pods}
    assert roles == {
        "us-east-prefill-0": engine_pb.POD_ROLE_PREFILL,
        "us-east-decode-0": engine_pb.POD_ROLE_DECODE,
    }
    text = "Tell me about the mesh and its regions, " * 6
    turns, fallbacks = counted("disaggregated_turns"), counted("kv_transfer_fallbacks")
    events = await chat(mesh.region.address, text)
    assert (counted("disaggregated_turns"), counted("kv_transfer_fallbacks")) == (turns + 1, fallbacks)
    started = next(event.started for event in events if event.HasField("started"))
    assert started.pod_id == "us-east-decode-0"
    tokens = sum(len(event.delta.token_ids) for event in events if event.HasField("delta"))
    assert tokens == 16
    assert events[-1].HasField("finished")
    usage = next(event.usage.usage for event in events if event.HasField("usage"))
    assert usage.output_tokens == 16 and usage.input_tokens > 0
    # The prompt was computed on the prefill pod; the decode pod received its
    # blocks (and looked none up in its own prefix cache).
    prefill_pool, decode_pool = backend(mesh.prefill).pool, backend(mesh.decode).pool
    assert prefill_pool.query_tokens == usage.input_tokens
    assert decode_pool.query_tokens == 0
    full_blocks = usage.input_tokens // decode_pool.block_size
    assert len(decode_pool.resident_hashes()) >= full_blocks
    # Nothing of either phase is left running.
    assert mesh.region.pool.pods[0].in_flight == 0 and mesh.region.pool.pods[1].in_flight == 0


async def test_without_its_prefill_pod_the_decode_pod_serves_whole_turns(mesh: PdMesh) -> None:
    await mesh.prefill.stop(0.5)
    pool = mesh.region.pool
    await wait_until(lambda: len(pool.healthy_pods) == 1, what="prefill pod down")
    events = await chat(mesh.region.address, "A short question.")
    started = next(event.started for event in events if event.HasField("started"))
    assert started.pod_id == "us-east-decode-0"
    assert events[-1].HasField("finished")


async def test_a_prefill_pod_failing_after_placement_is_a_counted_fallback(mesh: PdMesh) -> None:
    pool = mesh.region.pool
    prefill, decode = (
        next(p for p in pool.pods if p.pod_id == f"us-east-{n}-0") for n in ("prefill", "decode")
    )
    await mesh.prefill.stop(0.5)
    turns, fallbacks = counted("disaggregated_turns"), counted("kv_transfer_fallbacks")
    start = engine_pb.GenerateStart(
        request_id="fallback-1",
        prompt_token_ids=list(range(300, 340)),
        sampling=common_pb2.SamplingParams(max_tokens=4, seed=1),
    )
    view = phased_pod(prefill, decode)
    generation = await view.session.start("fallback-1", engine_pb.GenerateSessionRequest(start=start))
    try:
        events = [event async for event in generation]
    finally:
        generation.abandon("done")
    assert events[-1].finished.usage.output_tokens == 4
    # The decode pod computed the prompt itself, and the prefill pod is out of placement.
    assert backend(mesh.decode).pool.query_tokens == 40
    assert not prefill.healthy
    assert (counted("disaggregated_turns"), counted("kv_transfer_fallbacks")) == (turns + 1, fallbacks + 1)
