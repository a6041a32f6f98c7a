"""A real Envoy with TLS on every hop, in front of an mTLS zone: HTTPS SSE
through its HTTP listener to an HTTPS edge, ``ChatService`` turns through its
TLS gRPC listener to the regions over mutual TLS (failing over inside the
zone), and the callers and upstreams it must refuse."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
import pytest_asyncio
from cryptography import x509

from llmmesh.core.certs import CertificateAuthority
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.topology.envoy_config import REGION_HEADER, ZONE_HEADER, FrontProxy, RegionUpstream, Upstream
from llmmesh.topology.envoy_tls import PROXY_IDENTITY, SERVER_STEM
from llmmesh.v1 import common_pb2
from tests.deploy.envoy_process import RunningEnvoy, chat_on, running_envoy
from tests.deploy.tls_mesh import PUBLIC_NAME, SecureZone, secure_zone
from tests.stack import DEV_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]


@dataclass
class Fronted:
    """The zone and the Envoy in front of it."""

    zone: SecureZone
    envoy: RunningEnvoy

    @property
    def https_url(self) -> str:
        return f"https://{PUBLIC_NAME}:{self.envoy.http_port}"

    def channel(self, *, client_cert: bool = True) -> grpc.aio.Channel:
        return self.zone.certs.grpc_channel(self.envoy.grpc_address, client_cert=client_cert)


@pytest_asyncio.fixture
async def fronted(tmp_path: Path) -> AsyncIterator[Fronted]:
    # Slow enough decoding that a stream spans many reads.
    async with secure_zone(tmp_path / "certs", sim_inter_token_s=0.02) as zone:
        assert zone.edge.url.startswith("https://")
        east = Upstream.parse(zone.east.address)
        proxy = FrontProxy(
            edges=(Upstream.parse(zone.edge.url.removeprefix("https://")),),
            regions=(
                RegionUpstream("us-west", "us", Upstream.parse(zone.west.address)),
                RegionUpstream("us-east", "us", east),
                # A region of zone us listed as one of zone eu: its certificate says otherwise.
                RegionUpstream("eu-west", "eu", east),
            ),
            tls=zone.certs.proxy_tls(),
            health_check_interval_s=0.5,
        )
        async with running_envoy(proxy, tmp_path) as envoy:
            yield Fronted(zone, envoy)


async def test_sse_streams_over_https_through_envoy_to_an_https_edge(fronted: Fronted) -> None:
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 24,
        "stream": True,
    }
    verify = fronted.zone.certs.https_client()
    async with (
        httpx.AsyncClient(base_url=fronted.https_url, verify=verify, timeout=60) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {DEV_KEY}"}
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-llmmesh-region"] in {"us-east", "us-west"}
        reads = [chunk async for chunk in response.aiter_raw()]
    text = b"".join(reads).decode()
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    # Unbuffered: deltas reached the client in reads before the one that ended the stream.
    assert sum(1 for r in reads if b"data: {" in r and b"[DONE]" not in r) >= 2
    # The edge serves HTTPS only, and the regions mTLS only: every hop was TLS.
    assert await fronted.envoy.stat("cluster.edge.ssl.versions.TLSv1.3") >= 1


async def test_the_http_listener_offers_h2_and_http1(fronted: Fronted) -> None:
    def negotiate(offered: list[str]) -> str | None:
        context = fronted.zone.certs.https_client()
        context.set_alpn_protocols(offered)
        with (
            socket.create_connection(("127.0.0.1", fronted.envoy.http_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=PUBLIC_NAME) as tls,
        ):
            return tls.selected_alpn_protocol()

    assert await asyncio.to_thread(negotiate, ["h2", "http/1.1"]) == "h2"
    assert await asyncio.to_thread(negotiate, ["http/1.1"]) == "http/1.1"


async def test_chat_streams_through_the_tls_grpc_listener_over_upstream_mtls(fronted: Fronted) -> None:
    async with fronted.channel() as channel:
        events = await chat_on(channel, REGION_HEADER, "us-east")
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "started" and kinds[-2:] == ["usage", "finished"]
        assert "delta" in kinds
        assert events[0].started.region == "us-east"
        assert events[-1].finished.reason == common_pb2.FINISH_REASON_LENGTH
        by_zone = await chat_on(channel, ZONE_HEADER, "us")
    assert by_zone[0].started.region in {"us-east", "us-west"}
    assert by_zone[-1].WhichOneof("event") == "finished"
    # The regions serve mutual TLS only, so Envoy's mesh certificate was accepted.
    assert await fronted.envoy.stat("cluster.region-us-east.ssl.versions.TLSv1.3") >= 1


async def test_a_region_cluster_fails_over_inside_its_zone_over_mtls(fronted: Fronted) -> None:
    # Both hosts (us-west first, us-east behind it) healthy in Envoy's eyes: a first health
    # check may have timed out on a loaded machine.
    members = await fronted.envoy.stat("cluster.region-us-west.membership_total")
    assert members == 2
    assert await _stat_reaches(fronted.envoy, "cluster.region-us-west.membership_healthy", members) == members
    async with fronted.channel() as channel:
        for _ in range(3):
            events = await chat_on(channel, REGION_HEADER, "us-west")
            assert events[0].started.region == "us-west", "priority 0 (the home region) serves while healthy"
        await fronted.zone.stop_west()
        for _ in range(3):
            events = await chat_on(channel, REGION_HEADER, "us-west")
            assert events[0].started.region == "us-east", "priority 1 (the zone peer) serves once it is down"
            assert events[-1].WhichOneof("event") == "finished"


async def test_a_region_whose_certificate_names_another_zone_is_refused(fronted: Fronted) -> None:
    async with fronted.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await chat_on(channel, REGION_HEADER, "eu-west")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await fronted.envoy.stat("cluster.region-eu-west.ssl.fail_verify_san") >= 1


async def test_plaintext_callers_are_refused_on_both_listeners(fronted: Fronted) -> None:
    async with httpx.AsyncClient(base_url=fronted.envoy.http_url, timeout=10) as client:
        with pytest.raises(httpx.TransportError):
            await client.get("/v1/models", headers={"authorization": f"Bearer {DEV_KEY}"})
    async with grpc.aio.insecure_channel(fronted.envoy.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await chat_on(channel, REGION_HEADER, "us-east")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_grpc_listener_asks_for_a_client_certificate(fronted: Fronted) -> None:
    async with fronted.channel(client_cert=False) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await chat_on(channel, REGION_HEADER, "us-east")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await fronted.envoy.stat("listener.127.0.0.1_0.ssl.fail_verify_no_cert") >= 1


def _served_serial(port: int, public_ca: Path) -> int:
    """The serial number of the certificate Envoy serves on a new connection to ``port``."""
    context = ssl.create_default_context(cafile=str(public_ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=PUBLIC_NAME) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def _stat_reaches(envoy: RunningEnvoy, name: str, least: int, wait_s: float = 10.0) -> int:
    deadline = asyncio.get_running_loop().time() + wait_s
    while (value := await envoy.stat(name)) < least and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    return value


async def test_rotated_certificates_are_served_without_a_restart(fronted: Fronted) -> None:
    certs = fronted.zone.certs
    port = fronted.envoy.http_port
    before = await asyncio.to_thread(_served_serial, port, certs.public_ca)
    # The public certificate, renewed and put in place as `llmmesh certs` writes: key first, each renamed.
    public = certs.public_ca.parent
    renewed = CertificateAuthority.open(public, ca_dir=public.with_name("public-ca")).issue(
        PlaneIdentity(Role.EDGE, "front-proxy"), hosts=(PUBLIC_NAME,)
    )
    directory = certs.mesh.ca.directory
    for source, name in ((renewed.key, f"{SERVER_STEM}.key"), (renewed.cert, f"{SERVER_STEM}.pem")):
        staged = directory / f".{name}.new"
        shutil.copyfile(source, staged)
        os.replace(staged, directory / name)
    deadline = asyncio.get_running_loop().time() + 10
    while (after := await asyncio.to_thread(_served_serial, port, certs.public_ca)) == before:
        assert asyncio.get_running_loop().time() < deadline, "Envoy still serves the old certificate"
        await asyncio.sleep(0.1)
    assert after == x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
    # Its mesh identity toward the regions, rotated by the mesh CA: taken up too, and turns still stream.
    certs.mesh.ca.issue(PROXY_IDENTITY)
    updates = "cluster.region-us-east.client_ssl_socket_factory.ssl_context_update_by_sds"
    assert await _stat_reaches(fronted.envoy, updates, 1) >= 1
    async with fronted.channel() as channel:
        events = await chat_on(channel, REGION_HEADER, "us-east")
    assert events[-1].WhichOneof("event") == "finished"
