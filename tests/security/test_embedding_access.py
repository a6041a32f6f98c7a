"""Who may call the embedding and moderation RPCs on a secured mesh: a
pod's EmbeddingService only the region that owns it; a region's
RegionEmbeddingService and ModerationService the edge and clients, as its
ChatService. Everyone else is refused with PERMISSION_DENIED before a
handler runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from llmmesh.core.errors import Reason, from_rpc_error
from llmmesh.core.identity import Role, role_name
from llmmesh.v1 import embedding_service_pb2 as epb
from llmmesh.v1 import embedding_service_pb2_grpc as epb_grpc
from llmmesh.v1 import moderation_service_pb2 as mpb
from llmmesh.v1 import moderation_service_pb2_grpc as mpb_grpc
from tests.security.mesh_pki import CLIENT, EDGE, EU_WEST, POD, US_EAST, US_WEST, SecureStack, secure_stack
from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio
POD_NAME = role_name(Role.ENGINE, "us", "us-east")
REGION_NAME = role_name(Role.REGION)
AUTH = (("authorization", f"Bearer {DEV_KEY}"),)
MODEL = "llmmesh-tiny-embed"


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[SecureStack]:
    async with secure_stack(tmp_path) as running:
        yield running


async def _denied(call: Awaitable[object]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    error = from_rpc_error(info.value)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, error
    assert error.reason == Reason.PEER_NOT_ALLOWED


async def test_only_the_owning_region_embeds_on_a_pod(stack: SecureStack) -> None:
    request = epb.EmbedRequest(model=MODEL, inputs=[epb.EmbeddingInput(text="hello")])
    async with stack.pki.channel(stack.engine.address, US_EAST, POD_NAME) as ch:
        answer = await epb_grpc.EmbeddingServiceStub(ch).Embed(request, timeout=5)
    assert len(answer.embeddings) == 1
    for holder in (US_WEST, EU_WEST, EDGE, CLIENT, POD):
        async with stack.pki.channel(stack.engine.address, holder, POD_NAME) as ch:
            stub = epb_grpc.EmbeddingServiceStub(ch)
            await _denied(stub.Embed(request, timeout=5))
            await _denied(stub.GetEmbeddingInfo(epb.GetEmbeddingInfoRequest(), timeout=5))


async def test_a_region_embeds_and_moderates_for_the_edge_and_clients_only(stack: SecureStack) -> None:
    embed = epb.CreateEmbeddingsRequest(model=MODEL, inputs=[epb.EmbeddingInput(text="hello")])
    moderate = mpb.ModerateRequest(inputs=["hello"])
    for holder in (EDGE, CLIENT):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            # The region found its pod's embedding model over mTLS, as the owning region.
            created = await epb_grpc.RegionEmbeddingServiceStub(ch).CreateEmbeddings(
                embed, metadata=AUTH, timeout=10
            )
            assert created.embeddings[0].input_tokens > 0
            moderated = await mpb_grpc.ModerationServiceStub(ch).Moderate(moderate, metadata=AUTH, timeout=10)
            assert not moderated.results[0].flagged
    for holder in (POD, US_WEST, EU_WEST):
        async with stack.pki.channel(stack.region.address, holder, REGION_NAME) as ch:
            await _denied(
                epb_grpc.RegionEmbeddingServiceStub(ch).CreateEmbeddings(embed, metadata=AUTH, timeout=10)
            )
            await _denied(mpb_grpc.ModerationServiceStub(ch).Moderate(moderate, metadata=AUTH, timeout=10))
