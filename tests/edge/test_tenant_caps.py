"""A tenant's caps on what it keeps in its zone, set in its policy over the
global plane's gRPC and honoured by the region: the most files, vector
stores and facts per end user. Past a cap, a create is refused with an
OpenAI error naming the parameter and the cap; the facts kept about one
end user are the newest ones, no more."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import common_pb2, policy_service_pb2, policy_service_pb2_grpc
from tests.edge.sdk import async_client
from tests.stack import Stack

pytestmark = pytest.mark.asyncio
POLL_S, WAIT_S = 0.05, 10.0


async def capped_tenant(stack: Stack, **caps: int) -> tuple[str, str]:
    """A new tenant of zone us with ``caps`` (and memory on): its id and a key."""
    async with open_channel(stack.global_plane.address) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        spec = policy_service_pb2.Tenant(
            name=f"capped-{len(caps)}-{sum(caps.values())}",
            zone="us",
            tier=common_pb2.TIER_PRO,
            memory_enabled=True,
        )
        for field, cap in caps.items():
            setattr(spec, field, cap)
        tenant = (await policy.CreateTenant(policy_service_pb2.CreateTenantRequest(tenant=spec))).tenant
        assert {name: getattr(tenant, name) for name in caps} == caps
        made = await policy.CreateApiKey(policy_service_pb2.CreateApiKeyRequest(tenant=tenant.id))
    assert await stack.region.policy.refresh()
    return tenant.id, str(made.secret)


async def test_files_and_vector_stores_stop_at_the_tenants_caps(stack: Stack) -> None:
    _, key = await capped_tenant(stack, max_files=2, max_vector_stores=1)
    async with async_client(stack, key) as client:
        kept = [
            await client.files.create(file=(f"f{n}.txt", b"some text"), purpose="assistants")
            for n in range(2)
        ]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.files.create(file=("f2.txt", b"more text"), purpose="assistants")
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == "file", error
        assert "keeps 2 files in this zone, its most (max_files 2)" in error["message"]
        # Deleting one makes room again.
        await client.files.delete(kept[0].id)
        await client.files.create(file=("f3.txt", b"again"), purpose="assistants")
        await client.vector_stores.create(name="one")
        with pytest.raises(openai.BadRequestError) as second:
            await client.vector_stores.create(name="two")
        assert isinstance(second.value.body, dict) and second.value.body["param"] == "vector_store"


async def test_a_tenant_keeps_its_cap_of_facts_per_end_user(stack: Stack) -> None:
    _, key = await capped_tenant(stack, max_memories_per_user=1)
    assert stack.edge is not None
    says = "Hello! My name is Greta Holm and I live in Bremen."
    body = {
        "model": "auto",
        "max_tokens": 4,
        "user": "greta",
        "messages": [{"role": "user", "content": says}],
    }
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as http:
        assert (await http.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
        facts: list[dict[str, object]] = []
        for _ in range(int(WAIT_S / POLL_S)):
            facts = (await http.get("/v1/memories", params={"user": "greta"}, headers=headers)).json()["data"]
            if facts:
                break
            await asyncio.sleep(POLL_S)
    # Two facts were said (the name, the city), in one turn: they land together, and one is kept.
    assert len(facts) == 1, facts
