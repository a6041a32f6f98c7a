"""Every plane's gRPC port as an attacker reaches it: without a certificate,
with one from another CA, or with a mesh certificate of the wrong role or
place. Each is refused before a handler runs (no certificate: the TLS
handshake fails) or with PERMISSION_DENIED and ErrorInfo."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
import pytest_asyncio
from cryptography import x509
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmmesh.core.errors import DOMAIN, MeshError, Reason, from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.core.mtls import MeshTlsSettings, TlsSetupError
from llmmesh.edge.server import start_edge
from llmmesh.edge.settings import EdgeSettings
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    engine_service_pb2,
    engine_service_pb2_grpc,
    geo_routing_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import model_registry_service_pb2 as mpb
from llmmesh.v1 import policy_service_pb2 as ppb
from tests.security.mesh_pki import (
    ADMIN,
    CLIENT,
    EDGE,
    EU_WEST,
    POD,
    US_EAST,
    US_WEST,
    SecureStack,
    make_pki,
    secure_stack,
)
from tests.stack import DEV_KEY

GLOBAL_NAME = role_name(Role.GLOBAL)
POD_NAME = role_name(Role.ENGINE, "us", "us-east")
REGION_NAME = role_name(Role.REGION)


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[SecureStack]:
    async with secure_stack(tmp_path) as running:
        yield running


async def _fails(call: Awaitable[object]) -> tuple[grpc.StatusCode, MeshError]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), from_rpc_error(info.value)


async def _denied(call: Awaitable[object]) -> MeshError:
    """The refusal of a call from a mesh certificate of the wrong role or place."""
    code, error = await _fails(call)
    assert code == grpc.StatusCode.PERMISSION_DENIED, error
    assert error.reason == Reason.PEER_NOT_ALLOWED
    assert "peer" in error.metadata
    return error


async def _handshake_refused(address: str, credentials: grpc.ChannelCredentials | None, name: str) -> None:
    options = [("grpc.ssl_target_name_override", name)]
    channel = (
        grpc.aio.secure_channel(address, credentials, options=options)
        if credentials is not None
        else grpc.aio.insecure_channel(address)
    )
    async with channel:
        stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
        code, _ = await _fails(stub.GetTenant(ppb.GetTenantRequest(tenant="dev"), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE


# ------------------------------------------------------------ no certificate, a foreign one


@pytest.mark.asyncio
async def test_no_certificate_or_a_foreign_one_cannot_reach_any_plane(stack: SecureStack) -> None:
    ca = stack.pki.files(ADMIN).ca.read_bytes()
    targets = [
        (stack.global_plane.address, GLOBAL_NAME),
        (stack.region.address, REGION_NAME),
        (stack.engine.address, POD_NAME),
    ]
    foreign = stack.pki.foreign_security(ADMIN).channel_credentials()
    for address, name in targets:
        # Plaintext, TLS without a client certificate, a certificate of another CA.
        await _handshake_refused(address, None, name)
        await _handshake_refused(address, grpc.ssl_channel_credentials(ca), name)
        await _handshake_refused(address, foreign, name)


@pytest.mark.asyncio
async def test_a_client_checks_whom_it_reached(stack: SecureStack) -> None:
    """A region dialling a pod expects a pod of its own region: another's is refused by the client."""
    async with stack.pki.channel(
        stack.engine.address, US_EAST, role_name(Role.ENGINE, "us", "us-west")
    ) as ch:
        code, _ = await _fails(
            engine_service_pb2_grpc.EngineServiceStub(ch).GetEngineInfo(
                engine_service_pb2.GetEngineInfoRequest(), timeout=5
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE


# ------------------------------------------------------------ engine pods


@pytest.mark.asyncio
async def test_only_the_owning_region_drives_a_pod(stack: SecureStack) -> None:
    request = engine_service_pb2.GetEngineInfoRequest()
    async with stack.pki.channel(stack.engine.address, US_EAST, POD_NAME) as ch:
        info = await engine_service_pb2_grpc.EngineServiceStub(ch).GetEngineInfo(request, timeout=5)
    assert info.pod_id == POD.name
    for holder in (US_WEST, EU_WEST, EDGE, CLIENT, POD):
        async with stack.pki.channel(stack.engine.address, holder, POD_NAME) as ch:
            stub = engine_service_pb2_grpc.EngineServiceStub(ch)
            await _denied(stub.GetEngineInfo(request, timeout=5))
            generate = stub.Generate()
            error = await _denied(generate.read())
            assert holder.uri in error.message or holder.uri == error.metadata["peer"]


@pytest.mark.asyncio
async def test_an_operator_may_look_at_a_pod_but_never_make_it_work(stack: SecureStack) -> None:
    """Work on a pod is metered, queued and billed only through its region:
    the admin certificate reads the pod's description, load and tokenizer,
    and is refused generation and embedding."""
    async with stack.pki.channel(stack.engine.address, ADMIN, POD_NAME) as ch:
        stub = engine_service_pb2_grpc.EngineServiceStub(ch)
        info = await stub.GetEngineInfo(engine_service_pb2.GetEngineInfoRequest(), timeout=5)
        assert info.pod_id == POD.name
        tokens = await stub.Tokenize(engine_service_pb2.TokenizeRequest(text="hello"), timeout=5)
        assert len(tokens.token_ids) > 0
        for call in (stub.Generate(), stub.GenerateSession()):
            error = await _denied(call.read())
            assert ADMIN.uri in error.message or ADMIN.uri == error.metadata["peer"]


# ------------------------------------------------------------ regions


AUTH = (("authorization", f"Bearer {DEV_KEY}"),)


def _start() -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        start=chat_service_pb2.ChatStart(
            model="auto",
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="hello")],
            sampling=common_pb2.SamplingParams(max_tokens=4),
        )
    )


@pytest.mark.asyncio
async def test_a_region_serves_turns_to_the_edge_and_clients_only(stack: SecureStack) -> None:
    for holder in (EDGE, CLIENT):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            call = chat_service_pb2_grpc.ChatServiceStub(ch).Chat(iter([_start()]), metadata=AUTH, timeout=15)
            events = [event async for event in call]
        assert events[-1].HasField("finished"), events[-1]
    for holder in (POD, US_WEST, EU_WEST):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            # Refused on arrival, before any message is read; sending none
            # keeps grpc's client from reporting a write that raced the
            # refusal as INTERNAL (grpc/grpc#36066).
            call = chat_service_pb2_grpc.ChatServiceStub(ch).Chat(metadata=AUTH, timeout=15)
            await _denied(call.read())


@pytest.mark.asyncio
async def test_region_info_is_for_planes_of_its_zone(stack: SecureStack) -> None:
    request = chat_service_pb2.GetRegionInfoRequest()
    async with stack.pki.channel(stack.region.address, EDGE, REGION_NAME) as ch:
        info = await chat_service_pb2_grpc.ChatServiceStub(ch).GetRegionInfo(request, timeout=5)
    assert info.region == "us-east"
    for holder in (EU_WEST, CLIENT, POD):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            await _denied(chat_service_pb2_grpc.ChatServiceStub(ch).GetRegionInfo(request, timeout=5))


# ------------------------------------------------------------ the global plane


@pytest.mark.asyncio
async def test_admin_changes_need_an_admin_certificate_and_are_audited(stack: SecureStack) -> None:
    create = ppb.CreateTenantRequest(tenant=ppb.Tenant(name="acme", zone="eu", tier=common_pb2.TIER_PRO))
    for holder in (CLIENT, EDGE, US_EAST, POD):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            policy = policy_service_pb2_grpc.PolicyServiceStub(ch)
            await _denied(policy.CreateTenant(create, timeout=5))
            await _denied(policy.CreateApiKey(ppb.CreateApiKeyRequest(tenant="dev"), timeout=5))
            await _denied(policy.ListAuditEvents(ppb.ListAuditEventsRequest(), timeout=5))
    async with stack.pki.channel(stack.global_plane.address, ADMIN, GLOBAL_NAME) as ch:
        policy = policy_service_pb2_grpc.PolicyServiceStub(ch)
        tenant = (await policy.CreateTenant(create, timeout=5)).tenant
        key = await policy.CreateApiKey(
            ppb.CreateApiKeyRequest(tenant=tenant.id, secret="sk-acme-secret-1"), timeout=5
        )
        await policy.RevokeApiKey(ppb.RevokeApiKeyRequest(key_id=key.api_key.id), timeout=5)
        model = mpb.Model(
            name="llmmesh-big",
            tier=mpb.MODEL_TIER_LARGE,
            context_window=8192,
            pricing=mpb.ModelPricing(input_per_1k_usd="0.01", output_per_1k_usd="0.02"),
        )
        registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(ch)
        await registry.UpsertModel(mpb.UpsertModelRequest(model=model), timeout=5)
        first = await policy.ListAuditEvents(ppb.ListAuditEventsRequest(page_size=2), timeout=5)
        rest = await policy.ListAuditEvents(
            ppb.ListAuditEventsRequest(page_size=2, page_token=first.next_page_token), timeout=5
        )
    events = [*first.events, *rest.events]
    assert [e.method for e in events] == ["CreateTenant", "CreateApiKey", "RevokeApiKey", "UpsertModel"]
    assert {e.actor for e in events} == {ADMIN.uri}
    assert [e.target for e in events] == [tenant.id, key.api_key.id, key.api_key.id, "llmmesh-big"]
    assert json.loads(events[1].request_json)["secret"] == "<redacted>"
    assert all("sk-acme-secret-1" not in e.request_json for e in events)
    assert not rest.next_page_token


def _report(region: str, zone: str, address: str = "127.0.0.1:1") -> gpb.HeartbeatRequest:
    return gpb.HeartbeatRequest(
        report=gpb.RegionReport(
            region=region,
            zone=zone,
            chat_address=address,
            health=common_pb2.HEALTH_STATE_SERVING,
            capacity=8,
            models=["llmmesh-tiny"],
            location=common_pb2.GeoPoint(latitude=1.0, longitude=1.0),
        )
    )


@pytest.mark.asyncio
async def test_a_region_heartbeats_only_as_itself(stack: SecureStack) -> None:
    """A us region's certificate cannot register as eu-west (and so receive eu traffic)."""
    async with stack.pki.channel(stack.global_plane.address, US_EAST, GLOBAL_NAME) as ch:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(ch)
        await _denied(geo.Heartbeat(_report("eu-west", "eu"), timeout=5))
        await _denied(geo.Heartbeat(_report("us-west", "us"), timeout=5))
        await _denied(geo.Heartbeat(_report("us-east", "eu"), timeout=5))
        await geo.Heartbeat(_report("us-east", "us", stack.region.address), timeout=5)
    for holder in (EDGE, CLIENT, POD, ADMIN):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(ch)
            await _denied(geo.Heartbeat(_report("eu-west", "eu"), timeout=5))
    async with stack.pki.channel(stack.global_plane.address, EDGE, GLOBAL_NAME) as ch:
        listed = await geo_routing_service_pb2_grpc.GeoRoutingServiceStub(ch).ListRegions(
            gpb.ListRegionsRequest(), timeout=5
        )
    assert {s.report.region for s in listed.regions} == {"us-east"}


@pytest.mark.asyncio
async def test_usage_comes_only_from_the_region_that_ran_it(stack: SecureStack) -> None:
    async with stack.pki.channel(stack.global_plane.address, ADMIN, GLOBAL_NAME) as ch:
        tenant = (
            await policy_service_pb2_grpc.PolicyServiceStub(ch).GetTenant(
                ppb.GetTenantRequest(tenant="dev"), timeout=5
            )
        ).tenant

    def record(region: str, request_id: str) -> bpb.RecordUsageRequest:
        return bpb.RecordUsageRequest(
            records=[
                bpb.UsageRecord(
                    request_id=request_id,
                    tenant_id=tenant.id,
                    model="llmmesh-tiny",
                    region=region,
                    usage=common_pb2.TokenUsage(input_tokens=5, output_tokens=7),
                )
            ]
        )

    async with stack.pki.channel(stack.global_plane.address, US_WEST, GLOBAL_NAME) as ch:
        billing = billing_service_pb2_grpc.BillingServiceStub(ch)
        # Another region's turns (a region could erase them from billing by shipping zeros first).
        await _denied(billing.RecordUsage(record("us-east", "req-forged"), timeout=5))
    async with stack.pki.channel(stack.global_plane.address, EU_WEST, GLOBAL_NAME) as ch:
        billing = billing_service_pb2_grpc.BillingServiceStub(ch)
        # A tenant of another zone.
        await _denied(billing.RecordUsage(record("eu-west", "req-forged-2"), timeout=5))
    for holder in (EDGE, CLIENT, ADMIN):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            billing = billing_service_pb2_grpc.BillingServiceStub(ch)
            await _denied(billing.RecordUsage(record("us-east", "req-forged-3"), timeout=5))
    async with stack.pki.channel(stack.global_plane.address, US_EAST, GLOBAL_NAME) as ch:
        billing = billing_service_pb2_grpc.BillingServiceStub(ch)
        accepted = await billing.RecordUsage(record("us-east", "req-own"), timeout=5)
        assert accepted.accepted == 1
        missing = await billing.ReconcileUsage(
            bpb.ReconcileUsageRequest(request_ids=["req-forged", "req-forged-2", "req-forged-3", "req-own"]),
            timeout=5,
        )
    assert list(missing.missing_request_ids) == ["req-forged", "req-forged-2", "req-forged-3"]


@pytest.mark.asyncio
async def test_a_region_reads_the_policy_of_its_own_zone_only(stack: SecureStack) -> None:
    request = ppb.GetPolicySnapshotRequest(zone="us")
    async with stack.pki.channel(stack.global_plane.address, US_EAST, GLOBAL_NAME) as ch:
        snapshot = await policy_service_pb2_grpc.PolicyServiceStub(ch).GetPolicySnapshot(request, timeout=5)
    assert snapshot.snapshot.zone == "us"
    for holder in (EU_WEST, EDGE, CLIENT):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            await _denied(policy_service_pb2_grpc.PolicyServiceStub(ch).GetPolicySnapshot(request, timeout=5))


@pytest.mark.asyncio
async def test_every_refusal_names_the_mesh_domain(stack: SecureStack) -> None:
    async with stack.pki.channel(stack.global_plane.address, CLIENT, GLOBAL_NAME) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await policy_service_pb2_grpc.PolicyServiceStub(ch).ListTenants(
                ppb.ListTenantsRequest(), timeout=5
            )

    status = rpc_status.from_call(info.value)
    assert status is not None
    details = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(details) == 1
    found = error_details_pb2.ErrorInfo()
    details[0].Unpack(found)
    assert (found.domain, found.reason) == (DOMAIN, "PEER_NOT_ALLOWED")


# ------------------------------------------------------------ the edge, and rotation


@pytest.mark.asyncio
async def test_the_edge_streams_over_mtls_end_to_end(tmp_path: Path) -> None:
    async with secure_stack(tmp_path, with_edge=True) as running:
        assert running.edge is not None
        async with httpx.AsyncClient(base_url=running.edge.url, timeout=20) as http:
            reply = await http.post(
                "/v1/chat/completions",
                headers={"authorization": f"Bearer {DEV_KEY}"},
                json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1


def _presented_serial(address: str, holder_files: tuple[Path, Path, Path], server_name: str) -> int:
    """The serial number of the certificate a server presents on a new TLS connection."""
    cert, key, ca = holder_files
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.asyncio
async def test_a_rotated_certificate_is_served_without_a_restart(stack: SecureStack) -> None:
    admin = stack.pki.files(ADMIN)
    files = (admin.cert, admin.key, admin.ca)
    before = await asyncio.to_thread(_presented_serial, stack.region.address, files, REGION_NAME)
    async with stack.pki.channel(stack.region.address, EDGE, REGION_NAME) as held:
        stub = chat_service_pb2_grpc.ChatServiceStub(held)
        await stub.GetRegionInfo(chat_service_pb2.GetRegionInfoRequest(), timeout=5)
        stack.pki.ca.issue(US_EAST)
        after = await asyncio.to_thread(_presented_serial, stack.region.address, files, REGION_NAME)
        # The connection opened before the rotation goes on serving.
        await stub.GetRegionInfo(chat_service_pb2.GetRegionInfoRequest(), timeout=5)
    assert after != before
    # A new channel works against the new certificate, and the region still reaches its pod.
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        call = chat_service_pb2_grpc.ChatServiceStub(ch).Chat(iter([_start()]), metadata=AUTH, timeout=15)
        events = [event async for event in call]
    assert events[-1].HasField("finished")


def test_an_identity_names_its_place() -> None:
    region = PlaneIdentity.parse("spiffe://llmmesh/region/us/us-east/us-east")
    assert region == US_EAST
    assert region.dns_names == ["region.llmmesh", "us.region.llmmesh", "us-east.us.region.llmmesh"]
    with pytest.raises(ValueError, match="zone and a region"):
        PlaneIdentity(Role.REGION, "us-east")
    with pytest.raises(ValueError, match="not an identity of this mesh"):
        PlaneIdentity.parse("spiffe://other/region/us/us-east/us-east")


@pytest.mark.asyncio
async def test_a_plane_refuses_to_start_with_a_certificate_of_another_role(tmp_path: Path) -> None:

    pki = make_pki(tmp_path)
    with pytest.raises(TlsSetupError, match="not a edge identity"):
        await start_edge(EdgeSettings(port=0, global_address="127.0.0.1:1", **pki.settings(CLIENT)))  # type: ignore[arg-type]


def test_a_plane_without_a_certificate_says_how_to_get_one(tmp_path: Path) -> None:

    settings = MeshTlsSettings(tls_cert=str(tmp_path / "none.pem"))
    with pytest.raises(TlsSetupError, match=r"llmmesh certs issue.*--insecure"):
        settings.mesh_security("edge")
    assert not MeshTlsSettings(insecure=True).mesh_security("edge").enabled


@pytest.mark.asyncio
async def test_plaintext_channels_reach_only_insecure_planes(stack: SecureStack) -> None:
    async with open_channel(stack.region.address) as ch:
        code, _ = await _fails(
            chat_service_pb2_grpc.ChatServiceStub(ch).GetRegionInfo(
                chat_service_pb2.GetRegionInfoRequest(), timeout=5
            )
        )
    assert code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_only_the_edge_may_continue_a_turn(stack: SecureStack) -> None:
    """A continuation's carried tokens become the reply's start: only the edge vouches for them."""
    start = _start()
    start.start.continuation.CopyFrom(
        chat_service_pb2.Continuation(
            original_request_id="req-never-ran", original_region="us-west", emitted_token_ids=[1, 2, 3]
        )
    )
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        # Written, not half-closed: the refusal comes after the region read
        # the start, so no write races it (grpc/grpc#36066).
        call = chat_service_pb2_grpc.ChatServiceStub(ch).Chat(metadata=AUTH, timeout=15)
        await call.write(start)
        error = await _denied(call.read())
    assert "continue" in error.message
    async with stack.pki.channel(stack.region.address, EDGE, REGION_NAME) as ch:
        call = chat_service_pb2_grpc.ChatServiceStub(ch).Chat(iter([start]), metadata=AUTH, timeout=15)
        code, error = await _fails(call.read())
    # The edge may continue turns, but not one the zone store never saw start.
    assert code != grpc.StatusCode.PERMISSION_DENIED, error
