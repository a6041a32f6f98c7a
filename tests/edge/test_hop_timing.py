"""A streamed turn's way to its first token, hop by hop, in every plane:
one observation per hop of the edge, the region and the pod, and each
plane's whole time nested inside the window of the plane that called it
(the planes share this process's monotonic clock)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmmesh.core.grpcserver import open_channel
from llmmesh.edge import metrics as edge_metrics
from llmmesh.engine.hop_metrics import ENGINE_HOPS
from llmmesh.region import metrics as region_metrics
from llmmesh.v1 import common_pb2, engine_service_pb2, engine_service_pb2_grpc
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

EDGE_HOPS = edge_metrics.EDGE_HOPS
BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Tell me about hops."}],
    "max_tokens": 8,
    "stream": True,
}


def plane_hops(
    registry: CollectorRegistry, name: str, hops: tuple[str, ...]
) -> dict[str, tuple[float, float]]:
    """Each hop's (count, sum) in ``registry``."""
    return {
        hop: (
            registry.get_sample_value(f"{name}_count", {"hop": hop}) or 0.0,
            registry.get_sample_value(f"{name}_sum", {"hop": hop}) or 0.0,
        )
        for hop in hops
    }


async def pod_hops(stack: Stack, client: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """Each engine hop's (count, sum) over the stack's pods, read off their /metrics."""
    totals = dict.fromkeys(ENGINE_HOPS, (0.0, 0.0))
    for pod in stack.engines:
        text = (await client.get(pod.metrics.url)).text
        for family in text_string_to_metric_families(text):
            if family.name != "llmmesh_engine_hop_seconds":
                continue
            for sample in family.samples:
                hop = sample.labels.get("hop", "")
                count, total = totals[hop]
                if sample.name.endswith("_count"):
                    totals[hop] = (count + sample.value, total)
                elif sample.name.endswith("_sum"):
                    totals[hop] = (count, total + sample.value)
    return totals


def added(after: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each hop's new observations: count, and under ``{hop}_s`` their seconds."""
    out: dict[str, float] = {}
    for hop, (count, total) in after.items():
        out[hop] = count - before[hop][0]
        out[f"{hop}_s"] = total - before[hop][1]
    return out


async def test_a_streamed_turn_observes_each_hop_once_nested(
    shared_stack: Stack, shared_http: httpx.AsyncClient
) -> None:
    edge_name, region_name = "llmmesh_edge_hop_seconds", "llmmesh_region_hop_seconds"
    edge_before = plane_hops(edge_metrics.REGISTRY, edge_name, EDGE_HOPS)
    region_before = plane_hops(region_metrics.REGISTRY, region_name, region_metrics.REGION_HOPS)
    pods_before = await pod_hops(shared_stack, shared_http)

    resp = await shared_http.post(
        "/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {DEV_KEY}"}
    )
    assert resp.status_code == 200 and resp.content.endswith(b"data: [DONE]\n\n")

    edge = added(plane_hops(edge_metrics.REGISTRY, edge_name, EDGE_HOPS), edge_before)
    region = added(
        plane_hops(region_metrics.REGISTRY, region_name, region_metrics.REGION_HOPS), region_before
    )
    pods = added(await pod_hops(shared_stack, shared_http), pods_before)
    # The region's safety filters are on: every hop of every plane, once.
    assert {hop: edge[hop] for hop in EDGE_HOPS} == dict.fromkeys(EDGE_HOPS, 1.0)
    assert {hop: region[hop] for hop in region_metrics.REGION_HOPS} == dict.fromkeys(
        region_metrics.REGION_HOPS, 1.0
    )
    assert {hop: pods[hop] for hop in ENGINE_HOPS} == dict.fromkeys(ENGINE_HOPS, 1.0)
    # Each plane's time to its first token lies inside the caller's wait for
    # it (from before the caller's write of the start, which the callee may
    # read before the write returns).
    region_total = sum(region[f"{hop}_s"] for hop in region_metrics.REGION_HOPS)
    assert 0 < region_total <= edge["edge_in_s"] + edge["region_s"]
    pod_window = sum(
        region[f"{hop}_s"] for hop in ("pod_send", "pod_first_event", "request_id_hold", "pod_first_delta")
    )
    pod_total = sum(pods[f"{hop}_s"] for hop in ENGINE_HOPS)
    assert 0 < pod_total <= pod_window


async def test_a_pod_called_straight_times_its_hops_as_the_meshs_calls(
    shared_stack: Stack, shared_http: httpx.AsyncClient
) -> None:
    # The overhead bench compares the mesh's pod time with direct's Generate calls.
    before = await pod_hops(shared_stack, shared_http)
    start = engine_service_pb2.GenerateStart(
        request_id="hops-direct",
        model=shared_stack.engine.backend.info().model,
        messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Tell me about hops.")],
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )
    async with open_channel(shared_stack.engine.address) as channel:
        call = engine_service_pb2_grpc.EngineServiceStub(channel).Generate(
            iter([engine_service_pb2.GenerateRequest(start=start)]), timeout=10
        )
        events = [event async for event in call]
    assert events[-1].HasField("finished")
    pods = added(await pod_hops(shared_stack, shared_http), before)
    assert {hop: pods[hop] for hop in ENGINE_HOPS} == dict.fromkeys(ENGINE_HOPS, 1.0)
    assert all(pods[f"{hop}_s"] > 0 for hop in ENGINE_HOPS)
