"""The newer RPCs as an attacker reaches them, straight at each plane's gRPC
port over mTLS: files, vector stores and memories of another tenant, a
tenant of another zone, conversation branches of another conversation,
registry and directory changes without an admin certificate, and a forged
KV-transfer handle at a pod. Each is refused by code, never answered with
data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmmesh.bench.processes import free_port
from llmmesh.core.errors import Reason, from_rpc_error
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.retrieval import MAX_STORE_FILES
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    chat_service_pb2_grpc,
    common_pb2,
    engine_service_pb2,
    engine_service_pb2_grpc,
    geo_routing_service_pb2_grpc,
    memory_service_pb2_grpc,
    model_registry_service_pb2_grpc,
    policy_service_pb2_grpc,
    retrieval_service_pb2_grpc,
)
from llmmesh.v1 import chat_service_pb2 as cpb
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import memory_service_pb2 as mem
from llmmesh.v1 import model_registry_service_pb2 as mpb
from llmmesh.v1 import policy_service_pb2 as ppb
from llmmesh.v1 import retrieval_service_pb2 as rpb
from tests.security.mesh_pki import (
    ADMIN,
    CLIENT,
    EDGE,
    EU_WEST,
    GLOBAL,
    POD,
    US_EAST,
    US_WEST,
    SecureStack,
    secure_stack,
)
from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio

GLOBAL_NAME = role_name(Role.GLOBAL)
REGION_NAME = role_name(Role.REGION)
POD_NAME = role_name(Role.ENGINE, "us", "us-east")
SECRET = b"The launch code is 0000. Tell no other tenant."


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[SecureStack]:
    async with secure_stack(tmp_path) as running:
        yield running


def _auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def _tenant(stack: SecureStack, name: str, zone: str) -> str:
    """A new tenant of ``zone`` with a key (through the global plane, as an operator); the key."""
    async with stack.pki.channel(stack.global_plane.address, ADMIN, GLOBAL_NAME) as ch:
        policy = policy_service_pb2_grpc.PolicyServiceStub(ch)
        spec = ppb.Tenant(name=name, zone=zone, tier=common_pb2.TIER_PRO, memory_enabled=True)
        tenant = (await policy.CreateTenant(ppb.CreateTenantRequest(tenant=spec), timeout=5)).tenant
        made = await policy.CreateApiKey(ppb.CreateApiKeyRequest(tenant=tenant.id), timeout=5)
    assert await stack.region.policy.refresh()
    return str(made.secret)


async def _refused(call: Awaitable[object], *codes: grpc.StatusCode) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() in codes, info.value
    return info.value.code()


async def _denied(call: Awaitable[object]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value
    assert from_rpc_error(info.value).reason == Reason.PEER_NOT_ALLOWED


NOT_YOURS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)


# ------------------------------------------------------------ files and vector stores


async def test_another_tenant_s_files_and_stores_are_not_found_at_the_region_port(stack: SecureStack) -> None:
    rival = await _tenant(stack, "rival", "us")
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
        owner, other = _auth(DEV_KEY), _auth(rival)
        made = await files.CreateFile(
            rpb.CreateFileRequest(filename="plan.txt", purpose="assistants", content=SECRET),
            metadata=owner,
            timeout=10,
        )
        file_id = made.file.id
        store_id = (
            await files.CreateVectorStore(
                rpb.CreateVectorStoreRequest(name="mine"), metadata=owner, timeout=10
            )
        ).vector_store.id
        theirs_file = await files.CreateFile(
            rpb.CreateFileRequest(filename="x.txt", purpose="assistants", content=b"rival text"),
            metadata=other,
            timeout=10,
        )
        theirs_store = await files.CreateVectorStore(
            rpb.CreateVectorStoreRequest(name="theirs"), metadata=other, timeout=10
        )
        attacks: list[Callable[[], Awaitable[object]]] = [
            lambda: files.GetFile(rpb.GetFileRequest(file_id=file_id), metadata=other, timeout=10),
            lambda: files.GetFileContent(
                rpb.GetFileContentRequest(file_id=file_id), metadata=other, timeout=10
            ),
            lambda: files.DeleteFile(rpb.DeleteFileRequest(file_id=file_id), metadata=other, timeout=10),
            lambda: files.GetVectorStore(
                rpb.GetVectorStoreRequest(vector_store_id=store_id), metadata=other, timeout=10
            ),
            lambda: files.DeleteVectorStore(
                rpb.DeleteVectorStoreRequest(vector_store_id=store_id), metadata=other, timeout=10
            ),
            lambda: files.ListVectorStoreFiles(
                rpb.ListVectorStoreFilesRequest(vector_store_id=store_id), metadata=other, timeout=10
            ),
            lambda: files.GetVectorStoreFile(
                rpb.GetVectorStoreFileRequest(vector_store_id=store_id, file_id=file_id),
                metadata=other,
                timeout=10,
            ),
            lambda: files.DeleteVectorStoreFile(
                rpb.DeleteVectorStoreFileRequest(vector_store_id=store_id, file_id=file_id),
                metadata=other,
                timeout=10,
            ),
            # The owner's file into the rival's own store: its chunks would be the rival's to search.
            lambda: files.CreateVectorStoreFile(
                rpb.CreateVectorStoreFileRequest(
                    vector_store_id=theirs_store.vector_store.id, file_id=file_id
                ),
                metadata=other,
                timeout=10,
            ),
            # The rival's file into the owner's store: planting text in another tenant's retrieval.
            lambda: files.CreateVectorStoreFile(
                rpb.CreateVectorStoreFileRequest(vector_store_id=store_id, file_id=theirs_file.file.id),
                metadata=other,
                timeout=10,
            ),
            lambda: files.SearchVectorStores(
                rpb.SearchVectorStoresRequest(vector_store_ids=[store_id], query="launch code"),
                metadata=other,
                timeout=10,
            ),
        ]
        for attack in attacks:
            await _refused(attack(), *NOT_YOURS)
        listed = await files.ListFiles(rpb.ListFilesRequest(), metadata=other, timeout=10)
        assert [f.id for f in listed.files] == [theirs_file.file.id]
        stores = await files.ListVectorStores(rpb.ListVectorStoresRequest(), metadata=other, timeout=10)
        assert [s.id for s in stores.vector_stores] == [theirs_store.vector_store.id]
        # Nothing the rival tried changed the owner's file or store.
        kept = await files.GetFileContent(
            rpb.GetFileContentRequest(file_id=file_id), metadata=owner, timeout=10
        )
        assert kept.content == SECRET
        members = await files.ListVectorStoreFiles(
            rpb.ListVectorStoreFilesRequest(vector_store_id=store_id), metadata=owner, timeout=10
        )
        assert list(members.vector_store_files) == []


async def test_a_tenant_of_another_zone_is_unknown_to_this_zone_s_region(stack: SecureStack) -> None:
    """An eu tenant's key at a us region: no file is stored, no memory listed, no turn run here."""
    eu_key = await _tenant(stack, "eu-co", "eu")
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
        memories = memory_service_pb2_grpc.MemoryServiceStub(ch)
        chat = chat_service_pb2_grpc.ChatServiceStub(ch)
        meta = _auth(eu_key)
        refusals = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        create = rpb.CreateFileRequest(filename="eu.txt", purpose="assistants", content=b"eu only")
        await _refused(files.CreateFile(create, metadata=meta, timeout=10), *refusals)
        await _refused(
            memories.ListMemories(mem.ListMemoriesRequest(user="u"), metadata=meta, timeout=10), *refusals
        )
        await _refused(
            chat.CreateConversation(cpb.CreateConversationRequest(), metadata=meta, timeout=10), *refusals
        )


async def test_memories_are_reached_only_by_their_tenant(stack: SecureStack) -> None:
    rival = await _tenant(stack, "rival-mem", "us")
    assert stack.region.retrieval is not None
    owner_tenant = stack.region.policy.authenticate(DEV_KEY).tenant_id
    await MemoryStore(stack.region.retrieval.db).remember(
        owner_tenant, "greta", ["Greta's PIN is 1234."], "r1"
    )
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        memories = memory_service_pb2_grpc.MemoryServiceStub(ch)
        mine = await memories.ListMemories(
            mem.ListMemoriesRequest(user="greta"), metadata=_auth(DEV_KEY), timeout=10
        )
        [fact] = mine.memories
        theirs = await memories.ListMemories(
            mem.ListMemoriesRequest(user="greta"), metadata=_auth(rival), timeout=10
        )
        assert list(theirs.memories) == []
        await _refused(
            memories.DeleteMemories(
                mem.DeleteMemoriesRequest(memory_id=fact.id), metadata=_auth(rival), timeout=10
            ),
            grpc.StatusCode.NOT_FOUND,
        )
        by_user = await memories.DeleteMemories(
            mem.DeleteMemoriesRequest(user="greta"), metadata=_auth(rival), timeout=10
        )
        assert by_user.deleted == 0
        await _refused(
            memories.ListMemories(mem.ListMemoriesRequest(user="greta"), timeout=10),
            grpc.StatusCode.UNAUTHENTICATED,
        )
        kept = await memories.ListMemories(
            mem.ListMemoriesRequest(user="greta"), metadata=_auth(DEV_KEY), timeout=10
        )
    assert [m.content for m in kept.memories] == ["Greta's PIN is 1234."]


async def test_planes_of_the_mesh_cannot_read_tenant_content(stack: SecureStack) -> None:
    """A pod, another region (of this zone or another) or the global plane reach no
    files, memories or branches, even with a tenant's key."""
    for holder in (POD, US_WEST, EU_WEST, GLOBAL):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            meta = _auth(DEV_KEY)
            files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
            await _denied(files.ListFiles(rpb.ListFilesRequest(), metadata=meta, timeout=5))
            await _denied(
                files.GetFileContent(rpb.GetFileContentRequest(file_id="f"), metadata=meta, timeout=5)
            )
            await _denied(
                files.SearchVectorStores(
                    rpb.SearchVectorStoresRequest(vector_store_ids=["vs"], query="q"),
                    metadata=meta,
                    timeout=5,
                )
            )
            memories = memory_service_pb2_grpc.MemoryServiceStub(ch)
            await _denied(memories.ListMemories(mem.ListMemoriesRequest(user="u"), metadata=meta, timeout=5))
            await _denied(
                memories.DeleteMemories(mem.DeleteMemoriesRequest(user="u"), metadata=meta, timeout=5)
            )
            chat = chat_service_pb2_grpc.ChatServiceStub(ch)
            await _denied(
                chat.ListBranches(cpb.ListBranchesRequest(conversation_id="c"), metadata=meta, timeout=5)
            )


# ------------------------------------------------------------ conversation branches


def _turn(conversation_id: str, text: str, **branch: str) -> cpb.ChatRequest:
    return cpb.ChatRequest(
        start=cpb.ChatStart(
            model="auto",
            conversation_id=conversation_id,
            messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content=text)],
            sampling=common_pb2.SamplingParams(max_tokens=4),
            **branch,  # type: ignore[arg-type]
        )
    )


async def _events(
    chat: chat_service_pb2_grpc.ChatServiceStub, request: cpb.ChatRequest, key: str
) -> list[cpb.ChatResponse]:
    call = chat.Chat(iter([request]), metadata=_auth(key), timeout=15)
    return [event async for event in call]


async def test_a_branch_point_of_another_conversation_or_tenant_is_refused(stack: SecureStack) -> None:
    rival = await _tenant(stack, "rival-conv", "us")
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        chat = chat_service_pb2_grpc.ChatServiceStub(ch)
        owner = _auth(DEV_KEY)
        first = (
            await chat.CreateConversation(cpb.CreateConversationRequest(), metadata=owner, timeout=10)
        ).conversation.id
        other = (
            await chat.CreateConversation(cpb.CreateConversationRequest(), metadata=owner, timeout=10)
        ).conversation.id
        events = await _events(chat, _turn(first, "secret question"), DEV_KEY)
        assert events[-1].HasField("finished"), events[-1]
        stored = (
            await chat.ListMessages(
                cpb.ListMessagesRequest(conversation_id=first), metadata=owner, timeout=10
            )
        ).messages
        foreign = stored[-1].id
        for point in ("parent_message_id", "edit_message_id", "regenerate_message_id"):
            # A message of the owner's first conversation named as a branch point of the second.
            code = await _refused(
                _events(chat, _turn(other, "x", **{point: foreign}), DEV_KEY),
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND,
            )
            assert code is not None
        rival_conv = (
            await chat.CreateConversation(cpb.CreateConversationRequest(), metadata=_auth(rival), timeout=10)
        ).conversation.id
        await _refused(
            _events(chat, _turn(rival_conv, "x", parent_message_id=foreign), rival),
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
        )
        # The rival names the owner's conversation itself: not found, no branch listed.
        await _refused(_events(chat, _turn(first, "x", parent_message_id=foreign), rival), *NOT_YOURS)
        await _refused(
            chat.ListBranches(
                cpb.ListBranchesRequest(conversation_id=first), metadata=_auth(rival), timeout=10
            ),
            *NOT_YOURS,
        )
        await _refused(
            chat.ListMessages(
                cpb.ListMessagesRequest(conversation_id=first), metadata=_auth(rival), timeout=10
            ),
            *NOT_YOURS,
        )
        after = (
            await chat.ListMessages(
                cpb.ListMessagesRequest(conversation_id=other), metadata=owner, timeout=10
            )
        ).messages
        assert list(after) == []


# ------------------------------------------------------------ the global plane


async def test_registry_and_directory_changes_need_an_admin_certificate(stack: SecureStack) -> None:
    model = mpb.Model(
        name="llmmesh-cheap",
        tier=mpb.MODEL_TIER_SMALL,
        context_window=4096,
        pricing=mpb.ModelPricing(input_per_1k_usd="0", output_per_1k_usd="0"),
    )
    holders: tuple[PlaneIdentity, ...] = (CLIENT, EDGE, US_EAST, EU_WEST, POD)
    for holder in holders:
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(ch)
            await _denied(geo.RemoveRegion(gpb.RemoveRegionRequest(region="us-east"), timeout=5))
            registry = model_registry_service_pb2_grpc.ModelRegistryServiceStub(ch)
            await _denied(registry.UpsertModel(mpb.UpsertModelRequest(model=model), timeout=5))
    async with stack.pki.channel(stack.global_plane.address, ADMIN, GLOBAL_NAME) as ch:
        regions = await geo_routing_service_pb2_grpc.GeoRoutingServiceStub(ch).ListRegions(
            gpb.ListRegionsRequest(), timeout=5
        )
        names = [
            m.name
            for m in (
                await model_registry_service_pb2_grpc.ModelRegistryServiceStub(ch).ListModels(
                    mpb.ListModelsRequest(), timeout=5
                )
            ).models
        ]
    assert "us-east" in [r.report.region for r in regions.regions]
    assert "llmmesh-cheap" not in names


# ------------------------------------------------------------ engine pods


def _decode(handle: engine_service_pb2.KvTransfer, prompt: list[int]) -> engine_service_pb2.GenerateRequest:
    return engine_service_pb2.GenerateRequest(
        start=engine_service_pb2.GenerateStart(
            request_id="forged",
            prompt_token_ids=prompt,
            sampling=common_pb2.SamplingParams(max_tokens=2),
            kv_transfer=handle,
        )
    )


async def test_a_forged_kv_transfer_handle_is_refused_by_the_pod(stack: SecureStack) -> None:
    """Even the owning region cannot hand a pod counts no prefill pod issues (billing a turn as cached)."""
    prompt = list(range(10, 30))
    forged = [
        engine_service_pb2.KvTransfer(
            source_pod_id="prefill-x", source_request_id="r", prompt_tokens=len(prompt), blocks=2**31 - 1
        ),
        engine_service_pb2.KvTransfer(
            source_pod_id="prefill-x", source_request_id="r", prompt_tokens=len(prompt), blocks=-1
        ),
        engine_service_pb2.KvTransfer(
            source_pod_id="prefill-x",
            source_request_id="r",
            prompt_tokens=len(prompt),
            blocks=2,
            cached_prompt_tokens=-50,
        ),
        engine_service_pb2.KvTransfer(
            source_pod_id="prefill-x",
            source_request_id="r",
            prompt_tokens=len(prompt),
            blocks=2,
            cached_prompt_tokens=len(prompt) + 1,
        ),
    ]
    async with stack.pki.channel(stack.engine.address, US_EAST, POD_NAME) as ch:
        engine = engine_service_pb2_grpc.EngineServiceStub(ch)
        for handle in forged:
            call = engine.Generate(iter([_decode(handle, prompt)]), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [r async for r in call]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, handle
            assert from_rpc_error(info.value).metadata["param"] == "kv_transfer"
        # An honest handle of the same prompt still decodes.
        honest = engine_service_pb2.KvTransfer(
            source_pod_id="prefill-x", source_request_id="r", prompt_tokens=len(prompt), blocks=2
        )
        events = [r async for r in engine.Generate(iter([_decode(honest, prompt)]), timeout=10)]
    assert events[-1].HasField("finished")
    for holder in (US_WEST, EU_WEST, EDGE, CLIENT, POD):
        async with stack.pki.channel(stack.engine.address, holder, POD_NAME) as ch:
            call = engine_service_pb2_grpc.EngineServiceStub(ch).Generate(timeout=5)
            await _denied(call.read())


async def test_a_region_reads_the_usage_of_its_own_zone_s_tenants_only(stack: SecureStack) -> None:
    await _tenant(stack, "eu-usage", "eu")
    async with stack.pki.channel(stack.global_plane.address, ADMIN, GLOBAL_NAME) as ch:
        policy = policy_service_pb2_grpc.PolicyServiceStub(ch)
        us_id = (await policy.GetTenant(ppb.GetTenantRequest(tenant="dev"), timeout=5)).tenant.id
        eu_id = (await policy.GetTenant(ppb.GetTenantRequest(tenant="eu-usage"), timeout=5)).tenant.id
    async with stack.pki.channel(stack.global_plane.address, US_EAST, GLOBAL_NAME) as ch:
        billing = billing_service_pb2_grpc.BillingServiceStub(ch)
        await billing.GetUsage(bpb.GetUsageRequest(tenant_id=us_id), timeout=5)
        await _denied(billing.GetUsage(bpb.GetUsageRequest(tenant_id=eu_id), timeout=5))
        await _denied(
            billing.ReconcileUsage(bpb.ReconcileUsageRequest(tenant_id=eu_id, request_ids=["r"]), timeout=5)
        )
    async with stack.pki.channel(stack.global_plane.address, EU_WEST, GLOBAL_NAME) as ch:
        billing = billing_service_pb2_grpc.BillingServiceStub(ch)
        await billing.GetUsage(bpb.GetUsageRequest(tenant_id=eu_id), timeout=5)
        await _denied(billing.GetUsage(bpb.GetUsageRequest(tenant_id=us_id), timeout=5))
    for holder in (EDGE, ADMIN):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            await billing_service_pb2_grpc.BillingServiceStub(ch).GetUsage(
                bpb.GetUsageRequest(tenant_id=eu_id), timeout=5
            )
    for holder in (CLIENT, POD):
        async with stack.pki.channel(stack.global_plane.address, holder, GLOBAL_NAME) as ch:
            await _denied(
                billing_service_pb2_grpc.BillingServiceStub(ch).GetUsage(
                    bpb.GetUsageRequest(tenant_id=us_id), timeout=5
                )
            )


async def test_a_turn_cannot_retrieve_from_another_tenant_s_store(stack: SecureStack) -> None:
    rival = await _tenant(stack, "rival-rag", "us")
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
        store = await files.CreateVectorStore(
            rpb.CreateVectorStoreRequest(name="mine"), metadata=_auth(DEV_KEY), timeout=10
        )
        turn = _turn("", "what is the launch code?")
        turn.start.retrieval.vector_store_ids.append(store.vector_store.id)
        chat = chat_service_pb2_grpc.ChatServiceStub(ch)
        # Refused by name, not served as a turn that quietly "degraded" its retrieval.
        await _refused(_events(chat, turn, rival), grpc.StatusCode.NOT_FOUND)


async def test_a_region_s_probe_port_answers_health_and_nothing_else(tmp_path: Path) -> None:
    """Plaintext, no certificate: the kubelet's probe learns health, an attacker no tenant content."""
    port = free_port()
    async with secure_stack(tmp_path, probe_port=port) as running:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            meta = _auth(DEV_KEY)
            files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
            await _refused(
                files.ListFiles(rpb.ListFilesRequest(), metadata=meta, timeout=5),
                grpc.StatusCode.UNIMPLEMENTED,
            )
            memories = memory_service_pb2_grpc.MemoryServiceStub(ch)
            await _refused(
                memories.ListMemories(mem.ListMemoriesRequest(user="u"), metadata=meta, timeout=5),
                grpc.StatusCode.UNIMPLEMENTED,
            )
            chat = chat_service_pb2_grpc.ChatServiceStub(ch)
            await _refused(
                chat.ListBranches(cpb.ListBranchesRequest(conversation_id="c"), metadata=meta, timeout=5),
                grpc.StatusCode.UNIMPLEMENTED,
            )
        assert running.region.address.rsplit(":", 1)[1] != str(port)


async def test_a_store_s_file_list_is_bounded_and_names_each_file_once(stack: SecureStack) -> None:
    """Each id named is chunked and embedded: a repeated or endless list is refused before any work."""
    async with stack.pki.channel(stack.region.address, CLIENT, REGION_NAME) as ch:
        files = retrieval_service_pb2_grpc.RetrievalServiceStub(ch)
        meta = _auth(DEV_KEY)
        made = await files.CreateFile(
            rpb.CreateFileRequest(filename="a.txt", purpose="assistants", content=b"some text"),
            metadata=meta,
            timeout=10,
        )
        for ids in ([made.file.id] * 2, [made.file.id] * (MAX_STORE_FILES + 1)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await files.CreateVectorStore(
                    rpb.CreateVectorStoreRequest(name="s", file_ids=ids), metadata=meta, timeout=10
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert from_rpc_error(info.value).metadata["param"] == "file_ids"
        stores = await files.ListVectorStores(rpb.ListVectorStoresRequest(), metadata=meta, timeout=10)
    assert list(stores.vector_stores) == []
