"""Memory through the edge over an in-process mesh: off unless the tenant's
policy enables it; then an end user's stated facts are learned after a turn,
recalled into that user's later turns (and nobody else's), listed and
deleted through /v1/memories."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import common_pb2, policy_service_pb2, policy_service_pb2_grpc
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
SAYS = "Hello! My name is Greta Holm and I live in Bremen."
POLL_S, WAIT_S = 0.05, 10.0


async def tenant_key(stack: Stack, name: str, *, memory: bool) -> str:
    async with open_channel(stack.global_plane.address) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        spec = policy_service_pb2.Tenant(
            name=name, zone="us", tier=common_pb2.TIER_PRO, memory_enabled=memory
        )
        tenant = (await policy.CreateTenant(policy_service_pb2.CreateTenantRequest(tenant=spec))).tenant
        made = await policy.CreateApiKey(policy_service_pb2.CreateApiKeyRequest(tenant=tenant.id))
    assert await stack.region.policy.refresh()
    return str(made.secret)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def turn(http: httpx.AsyncClient, key: str, user: str, text: str = SAYS) -> int:
    """A turn of ``user``; its prompt tokens."""
    body = {"model": "auto", "max_tokens": 4, "user": user, "messages": [{"role": "user", "content": text}]}
    resp = await http.post("/v1/chat/completions", json=body, headers=auth(key))
    assert resp.status_code == 200, resp.text
    return int(resp.json()["usage"]["prompt_tokens"])


async def facts(http: httpx.AsyncClient, key: str, user: str) -> list[dict[str, object]]:
    resp = await http.get("/v1/memories", params={"user": user}, headers=auth(key))
    assert resp.status_code == 200, resp.text
    data: list[dict[str, object]] = resp.json()["data"]
    return data


async def learned(http: httpx.AsyncClient, key: str, user: str, count: int) -> list[dict[str, object]]:
    """The user's facts once there are ``count`` of them (bounded wait: learning runs after the turn)."""
    for _ in range(int(WAIT_S / POLL_S)):
        found = await facts(http, key, user)
        if len(found) >= count:
            return found
        await asyncio.sleep(POLL_S)
    return await facts(http, key, user)


async def test_memory_is_off_unless_the_tenant_turns_it_on(stack: Stack, http: httpx.AsyncClient) -> None:
    await turn(http, DEV_KEY, "u-off")
    assert stack.region.gateway.memory is not None
    await stack.region.gateway.memory.drain()
    assert await facts(http, DEV_KEY, "u-off") == []


async def test_facts_are_learned_recalled_listed_and_deleted(stack: Stack, http: httpx.AsyncClient) -> None:
    key = await tenant_key(stack, "remembers", memory=True)
    before = await turn(http, key, "greta")
    found = await learned(http, key, "greta", 2)
    assert sorted(str(f["content"]) for f in found) == [
        "The user lives in Bremen.",
        "The user's name is Greta Holm.",
    ]
    assert all(f["user"] == "greta" and str(f["id"]).startswith("mem_") for f in found)
    # Recalled into greta's next turn (more prompt), not into another user's.
    question = "Where do I live?"
    assert await turn(http, key, "greta", question) > await turn(http, key, "someone-else", question) + 5
    assert before > 0
    # Another tenant cannot see or delete them.
    other = await tenant_key(stack, "stranger", memory=True)
    assert await facts(http, other, "greta") == []
    assert (await http.delete(f"/v1/memories/{found[0]['id']}", headers=auth(other))).status_code == 404
    # A user named with the id must be the one the fact is about; any other parameter is refused.
    path = f"/v1/memories/{found[0]['id']}"
    wrong = await http.delete(path, params={"user": "someone-else"}, headers=auth(key))
    assert (wrong.status_code, wrong.json()["error"]["param"]) == (404, "memory_id")
    odd = await http.delete(path, params={"users": "greta"}, headers=auth(key))
    assert (odd.status_code, odd.json()["error"]["param"]) == (400, "users")
    one = await http.delete(path, params={"user": "greta"}, headers=auth(key))
    assert one.status_code == 200 and one.json()["deleted"] == 1
    rest = await http.delete("/v1/memories", params={"user": "greta"}, headers=auth(key))
    assert rest.json()["deleted"] == 1 and await facts(http, key, "greta") == []


async def test_listing_needs_the_user(http: httpx.AsyncClient) -> None:
    resp = await http.get("/v1/memories", headers=auth(DEV_KEY))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "user"
