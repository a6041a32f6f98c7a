"""The Envoy front proxy: its configs pass ``envoy --mode validate``, and a
real Envoy streams SSE from the edge and ``ChatService`` turns from the
regions, failing over to the zone's other region when the home one stops."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from engine.server import start_engine
from engine.settings import EngineSettings
from llmmesh.envoy_config import (
    HEADER,
    REGION_HEADER,
    ZONE_HEADER,
    FrontProxy,
    RegionUpstream,
    Upstream,
    embedded_front_proxy,
    envoy_config,
)
from llmmesh.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2
from llmmesh.yaml_text import to_yaml
from region.server import RegionPlane, start_region
from tests.stack import DEV_KEY, Stack, region_settings, running_stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "envoy" / "front-proxy.yaml"
ENVOY = Path(sys.executable).parent / "envoy"
STARTUP_TIMEOUT_S = 30.0
# Each Envoy of a run gets its own shared-memory id, so parallel runs never meet.
_BASE_IDS = itertools.count(os.getpid() % 10_000 * 100)


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(config), "--disable-hot-restart", "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# ---------------------------------------------------------------- the configs


def test_example_config_is_the_rendered_embedded_topology() -> None:
    assert EXAMPLE.read_text() == HEADER + to_yaml(envoy_config(embedded_front_proxy())), (
        f"{EXAMPLE} is stale: run python -m llmmesh.envoy_config > deploy/envoy/front-proxy.yaml"
    )


def test_example_config_validates() -> None:
    result = validate(EXAMPLE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_with_dns_names_validates(tmp_path: Path) -> None:
    proxy = FrontProxy(
        edges=(
            Upstream.parse("edge-0.llmmesh.internal:8080"),
            Upstream.parse("edge-1.llmmesh.internal:8080"),
        ),
        regions=(
            RegionUpstream("eu-west", "eu", Upstream.parse("chat.eu-west.llmmesh.internal:50051")),
            RegionUpstream("eu-central", "eu", Upstream.parse("chat.eu-central.llmmesh.internal:50051")),
            RegionUpstream("us-east", "us", Upstream.parse("10.0.0.7:50051")),
        ),
        http_port=8443,
        grpc_port=8444,
    )
    config = tmp_path / "envoy.yaml"
    config.write_text(to_yaml(envoy_config(proxy)))
    result = validate(config)
    assert result.returncode == 0, result.stdout + result.stderr
    clusters = {c["name"]: c for c in envoy_config(proxy)["static_resources"]["clusters"]}
    assert clusters["region-eu-west"]["type"] == "STRICT_DNS"
    assert clusters["region-us-east"]["type"] == "STATIC"


def test_region_clusters_fail_over_only_inside_their_zone() -> None:
    clusters = {c["name"]: c for c in envoy_config(embedded_front_proxy())["static_resources"]["clusters"]}
    localities = [
        (e["priority"], e["locality"]["region"])
        for e in clusters["region-eu-west"]["load_assignment"]["endpoints"]
    ]
    assert localities == [(0, "eu-west"), (1, "eu-central")]
    zone_us = clusters["zone-us"]["load_assignment"]["endpoints"]
    assert {(e["priority"], e["locality"]["region"]) for e in zone_us} == {(0, "us-east"), (0, "us-west")}
    for name, cluster in clusters.items():
        assert cluster["health_checks"] and cluster["outlier_detection"], name
        protocol = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ]
        if name != "edge":
            assert "http2_protocol_options" in protocol["explicit_http_config"]
            assert cluster["health_checks"][0]["grpc_health_check"] == {
                "service_name": "llmmesh.v1.ChatService"
            }


def test_routes_are_streaming_safe_and_never_retry_answers() -> None:
    listeners = envoy_config(embedded_front_proxy())["static_resources"]["listeners"]
    for listener in listeners:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        assert manager["stream_idle_timeout"] == "300s"
        for route in manager["route_config"]["virtual_hosts"][0]["routes"]:
            action = route["route"]
            assert action["timeout"] == "0s"
            retry = action["retry_policy"]
            assert retry["per_try_timeout"] == "30s"
            assert set(retry["retry_on"].split(",")) <= {
                "connect-failure",
                "refused-stream",
                "reset",
                "unavailable",
            }


# ---------------------------------------------------------------- a real Envoy


@dataclass
class RunningEnvoy:
    """A running Envoy and where its listeners bound."""

    process: subprocess.Popen[bytes]
    http_url: str
    grpc_address: str
    log: Path


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _text(path: Path) -> str:
    return path.read_text(errors="replace").strip() if path.exists() else ""


async def _wait_live(process: subprocess.Popen[bytes], admin_file: Path, log: Path) -> str:
    """Wait until Envoy's admin interface says LIVE; return its URL."""
    async with asyncio.timeout(STARTUP_TIMEOUT_S), httpx.AsyncClient(timeout=2) as client:
        while True:
            assert process.poll() is None, f"envoy exited:\n{_text(log)}"
            if address := _text(admin_file):
                try:
                    if (await client.get(f"http://{address}/ready")).text.strip() == "LIVE":
                        return f"http://{address}"
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.05)


@asynccontextmanager
async def running_envoy(proxy: FrontProxy, workdir: Path) -> AsyncIterator[RunningEnvoy]:
    """Run the real Envoy on ``proxy`` rendered with every port free (0); stop it afterwards."""
    proxy = dataclasses.replace(proxy, listen_host="127.0.0.1", http_port=0, grpc_port=0, admin_port=0)
    config, admin_file, log = workdir / "envoy.yaml", workdir / "envoy-admin", workdir / "envoy.log"
    config.write_text(to_yaml(envoy_config(proxy)))
    argv = [str(ENVOY), "-c", str(config), "--base-id", str(next(_BASE_IDS)), "--disable-hot-restart"]
    argv += ["--concurrency", "1", "--admin-address-path", str(admin_file), "--log-level", "warn"]
    process = _spawn(argv, log)
    try:
        admin = await _wait_live(process, admin_file, log)
        async with httpx.AsyncClient(timeout=5) as client:
            statuses = (await client.get(f"{admin}/listeners?format=json")).json()["listener_statuses"]
        ports = {s["name"]: s["local_address"]["socket_address"]["port_value"] for s in statuses}
        yield RunningEnvoy(process, f"http://127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}", log)
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait, 10)


@dataclass
class Mesh:
    """The in-process mesh (edge, us-east) with a second region us-west, behind a real Envoy."""

    stack: Stack
    west: RegionPlane
    envoy: RunningEnvoy
    west_stopped: bool = False

    async def stop_west(self) -> None:
        self.west_stopped = True
        await self.west.stop(0.5)


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    # Slow enough decoding that a stream spans many reads.
    async with running_stack(with_edge=True, sim_inter_token_s=0.02) as stack:
        assert stack.edge is not None
        pod = await start_engine(EngineSettings(pod_id="us-west-pod-0", sim_inter_token_s=0.02, insecure=True))
        west = await start_region(
            region_settings(stack.global_plane.address, [pod], region="us-west", location="45.6,-121.2")
        )
        proxy = FrontProxy(
            edges=(Upstream.parse(stack.edge.url.removeprefix("http://")),),
            regions=(
                RegionUpstream("us-west", "us", Upstream.parse(west.address)),
                RegionUpstream("us-east", "us", Upstream.parse(stack.region.address)),
            ),
            health_check_interval_s=0.5,
        )
        running: Mesh | None = None
        try:
            async with running_envoy(proxy, tmp_path) as envoy:
                running = Mesh(stack, west, envoy)
                yield running
        finally:
            if running is None or not running.west_stopped:
                await west.stop(0.5)
            await pod.stop(0.5)


def _start(max_tokens: int) -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Tell me about Envoy.")],
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
    )


async def chat_through(
    envoy: RunningEnvoy, header: str, value: str, max_tokens: int = 8
) -> list[chat_service_pb2.ChatResponse]:
    """One ChatService turn through Envoy's gRPC listener (no routing header when ``header`` is empty)."""
    metadata = (("authorization", f"Bearer {DEV_KEY}"), *([(header, value)] if header else []))
    async with open_channel(envoy.grpc_address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=metadata, timeout=60)
        await call.write(_start(max_tokens))
        await call.done_writing()
        return [event async for event in call]


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_sse_streams_through_envoy_incrementally(mesh: Mesh) -> None:
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 24,
        "stream": True,
    }
    reads: list[bytes] = []
    async with (
        httpx.AsyncClient(base_url=mesh.envoy.http_url, timeout=60) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {DEV_KEY}"}
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-llmmesh-region"] == "us-east"
        reads = [chunk async for chunk in response.aiter_raw()]
    text = b"".join(reads).decode()
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    # Unbuffered: deltas reached the client in reads before the one that ended the stream.
    assert sum(1 for r in reads if b"data: {" in r and b"[DONE]" not in r) >= 2


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_chat_stream_through_envoy_reaches_the_named_region(mesh: Mesh) -> None:
    events = await chat_through(mesh.envoy, REGION_HEADER, "us-east")
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-2:] == ["usage", "finished"]
    assert "delta" in kinds
    assert events[0].started.region == "us-east"
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    by_zone = await chat_through(mesh.envoy, ZONE_HEADER, "us")
    assert (
        by_zone[0].started.region in {"us-east", "us-west"} and by_zone[-1].WhichOneof("event") == "finished"
    )


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_a_region_cluster_fails_over_inside_its_zone(mesh: Mesh) -> None:
    for _ in range(3):
        events = await chat_through(mesh.envoy, REGION_HEADER, "us-west")
        assert events[0].started.region == "us-west", "priority 0 (the home region) serves while healthy"
    await mesh.stop_west()
    for _ in range(3):
        events = await chat_through(mesh.envoy, REGION_HEADER, "us-west")
        assert events[0].started.region == "us-east", "priority 1 (the zone peer) serves once it is down"
        assert events[-1].WhichOneof("event") == "finished"


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_a_stream_outlives_the_first_byte_guard(tmp_path: Path) -> None:
    """``per_try_timeout`` bounds the wait for the first byte only: a
    generation that streams for longer than it still ends normally."""
    async with running_stack(with_edge=True, sim_inter_token_s=0.05) as stack:
        assert stack.edge is not None
        proxy = FrontProxy(
            edges=(Upstream.parse(stack.edge.url.removeprefix("http://")),),
            regions=(RegionUpstream("us-east", "us", Upstream.parse(stack.region.address)),),
            first_byte_timeout_s=1.5,
        )
        async with running_envoy(proxy, tmp_path) as envoy:
            events = await chat_through(envoy, REGION_HEADER, "us-east", max_tokens=48)
    assert events[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
    assert sum(1 for e in events if e.WhichOneof("event") == "delta") > 1
