"""The engine client against an in-process simulator pod on port 0."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmmesh.bench.grpc_client import EngineGrpcClient, generate_request
from llmmesh.bench.loadgen import run_closed_loop
from llmmesh.bench.mesh_tls import issue_certs, pod_client_security, pod_server_name
from llmmesh.bench.stats import summarize
from llmmesh.bench.workload import ChatRequest, ChatWorkload
from llmmesh.engine.server import start_engine
from llmmesh.engine.settings import EngineSettings
from llmmesh.v1 import common_pb2

ZONE, REGION, POD = "us", "us-east", "us-east-pod-0"
# Fast steps: a 16-token reply takes a few milliseconds.
SIM = EngineSettings(
    insecure=True,
    max_num_seqs=4,
    sim_prefill_overhead_s=0.0001,
    sim_prefill_per_token_s=0.000001,
    sim_inter_token_s=0.0005,
)


def test_the_start_message_is_greedy_and_ignores_eos() -> None:
    request = ChatWorkload().requests("c1", 1, 16)[0]
    start = generate_request(request).start
    assert start.request_id == "c1-0"
    assert [message.role for message in start.messages] == [
        common_pb2.CHAT_ROLE_SYSTEM,
        common_pb2.CHAT_ROLE_USER,
    ]
    assert start.messages[0].content == request.system
    assert start.sampling.max_tokens == 16
    assert start.sampling.temperature == 0.0
    assert start.sampling.ignore_eos


@pytest.mark.asyncio
async def test_a_level_against_a_simulator_pod() -> None:
    pod = await start_engine(SIM)
    client = EngineGrpcClient(pod.address, request_timeout_s=30.0)
    try:
        run = await run_closed_loop(client, ChatWorkload().requests("c2", 4, 16), 2)
    finally:
        await client.close()
        await pod.stop(grace_s=0.5)
    metrics = summarize(run.records, run.wall_s)
    assert metrics.requests == 4
    assert metrics.errors == 0
    assert metrics.output_tokens == 4 * 16
    assert metrics.ttft_p50_s is not None
    assert metrics.itl_p50_s is not None


@pytest.mark.asyncio
async def test_a_refused_request_is_a_failed_request() -> None:
    pod = await start_engine(SIM)
    client = EngineGrpcClient(pod.address, request_timeout_s=30.0)
    request = ChatRequest(request_id="empty", system="", user="", max_tokens=4)
    try:
        record = await client.generate(request)
    finally:
        await client.close()
        await pod.stop(grace_s=0.5)
    assert record.error is not None
    assert record.error.startswith("INVALID_ARGUMENT")
    assert record.output_tokens == 0


@pytest.mark.asyncio
async def test_a_pod_on_mtls_streams_to_the_operators_certificate_only(tmp_path: Path) -> None:
    certs = issue_certs(tmp_path, ZONE, REGION, [POD])
    settings = dataclasses.replace(
        SIM,
        insecure=False,
        pod_id=POD,
        tls_cert=str(certs / f"engine-{POD}.pem"),
        tls_key=str(certs / f"engine-{POD}.key"),
        tls_ca=str(certs / "ca.pem"),
    )
    pod = await start_engine(settings)
    security = pod_client_security(certs, REGION)
    name = pod_server_name(ZONE, REGION)
    secured = EngineGrpcClient(pod.address, 30.0, security=security, server_name=name)
    plaintext = EngineGrpcClient(pod.address, 30.0)
    requests = ChatWorkload().requests("tls", 2, 8)
    try:
        served = await secured.generate(requests[0])
        refused = await plaintext.generate(requests[1])
    finally:
        await secured.close()
        await plaintext.close()
        await pod.stop(grace_s=0.5)
    assert served.ok and served.output_tokens == 8, served.error
    assert refused.error is not None and refused.error.startswith("UNAVAILABLE")
