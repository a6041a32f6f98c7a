"""The conversations API through the edge, over an in-process mesh: stored
history, paging by id, soft delete, and isolation between tenants and zones."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import common_pb2, policy_service_pb2, policy_service_pb2_grpc
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
AUTH = {"authorization": f"Bearer {DEV_KEY}"}


async def new_tenant(stack: Stack, name: str, *, rpm_limit: int = 0, tpm_limit: int = 0) -> str:
    """Create a tenant and a key through the global plane's admin RPCs; the key's secret.
    The region has the key once this returns."""
    async with open_channel(stack.global_plane.address) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        spec = policy_service_pb2.Tenant(
            name=name, zone="us", tier=common_pb2.TIER_PRO, rpm_limit=rpm_limit, tpm_limit=tpm_limit
        )
        tenant = (await policy.CreateTenant(policy_service_pb2.CreateTenantRequest(tenant=spec))).tenant
        made = await policy.CreateApiKey(policy_service_pb2.CreateApiKeyRequest(tenant=tenant.id))
    assert await stack.region.policy.refresh()
    return str(made.secret)


def sse_chunks(text: str) -> list[dict[str, object]]:
    """The JSON payloads of an SSE body, without the closing ``[DONE]``."""
    payloads = []
    for block in text.strip().split("\n\n"):
        data = "".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
        if data and data != "[DONE]":
            payloads.append(json.loads(data))
    return payloads


async def create(
    http: httpx.AsyncClient, headers: dict[str, str] = AUTH, **body: object
) -> dict[str, object]:
    resp = await http.post("/v1/conversations", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    created: dict[str, object] = resp.json()
    return created


async def test_a_conversation_keeps_its_history(http: httpx.AsyncClient) -> None:
    conversation = await create(http, title="Fruit", system_prompt="Answer briefly.")
    assert conversation["object"] == "conversation"
    assert (conversation["zone"], conversation["home_region"], conversation["model"]) == (
        "us",
        "us-east",
        "auto",
    )
    assert isinstance(conversation["created_at"], int) and conversation["created_at"] > 0
    cid = conversation["id"]

    # The first reply streams as a chat completion does.
    first = await http.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "Tell me about apples.", "stream": True, "stream_options": {"include_usage": True}},
        headers=AUTH,
    )
    assert first.status_code == 200, first.text
    assert first.headers["content-type"].startswith("text/event-stream")
    assert first.headers["x-llmmesh-region"] == "us-east"
    assert first.text.rstrip().endswith("data: [DONE]")
    chunks = sse_chunks(first.text)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    first_usage = chunks[-1]["usage"]
    assert isinstance(first_usage, dict) and first_usage["completion_tokens"] > 0

    # The second sees the first turn: its prompt holds the stored history.
    second = await http.post(
        f"/v1/conversations/{cid}/messages", json={"content": "And pears?", "max_tokens": 8}, headers=AUTH
    )
    assert second.status_code == 200, second.text
    completion = second.json()
    assert completion["object"] == "chat.completion"
    assert completion["id"] == second.headers["x-request-id"]
    history = first_usage["prompt_tokens"] + first_usage["completion_tokens"]
    assert completion["usage"]["prompt_tokens"] > history

    # Messages page oldest first, one at a time, by id.
    seen: list[dict[str, Any]] = []
    params: dict[str, str | int] = {"limit": 1}
    for _ in range(10):
        page = (await http.get(f"/v1/conversations/{cid}/messages", params=params, headers=AUTH)).json()
        assert page["object"] == "list" and len(page["data"]) == 1
        assert page["first_id"] == page["last_id"] == page["data"][0]["id"]
        seen.extend(page["data"])
        if not page["has_more"]:
            break
        params = {"limit": 1, "after": page["last_id"]}
    assert [m["role"] for m in seen] == ["user", "assistant", "user", "assistant"]
    assert [seen[0]["content"], seen[2]["content"]] == ["Tell me about apples.", "And pears?"]
    reply = seen[3]
    assert reply["object"] == "conversation.message" and reply["conversation_id"] == cid
    assert reply["content"] == completion["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] == completion["usage"]["completion_tokens"]
    assert reply["request_id"] == completion["id"]
    assert seen[0]["usage"] is None and seen[0]["finish_reason"] is None

    got = (await http.get(f"/v1/conversations/{cid}", headers=AUTH)).json()
    assert got["id"] == cid and got["title"] == "Fruit" and got["updated_at"] >= got["created_at"]


async def test_conversations_page_newest_first_by_id(http: httpx.AsyncClient) -> None:
    made = [(await create(http, title=f"c{n}"))["id"] for n in range(3)]
    first = (await http.get("/v1/conversations", params={"limit": 2}, headers=AUTH)).json()
    assert [c["id"] for c in first["data"]] == made[:0:-1]
    assert first["has_more"] is True
    rest = (
        await http.get("/v1/conversations", params={"limit": 2, "after": first["last_id"]}, headers=AUTH)
    ).json()
    assert [c["id"] for c in rest["data"]] == [made[0]]
    assert rest["has_more"] is False


@pytest.mark.parametrize(
    ("path", "params", "param"),
    [
        ("/v1/conversations", {"limit": "0"}, "limit"),
        ("/v1/conversations", {"limit": "101"}, "limit"),
        ("/v1/conversations", {"limit": "two"}, "limit"),
        ("/v1/conversations", {"after": "conv_us_us-east_00000000000000000000000000000000"}, "after"),
        ("/v1/conversations", {"after": "garbage"}, "after"),
        ("{conversation}/messages", {"after": "msg_nope"}, "after"),
    ],
)
async def test_bad_pages_are_400_naming_the_parameter(
    http: httpx.AsyncClient, path: str, params: dict[str, str], param: str
) -> None:
    conversation = await create(http)
    url = path.format(conversation=f"/v1/conversations/{conversation['id']}")
    resp = await http.get(url, params=params, headers=AUTH)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "content", "invalid_value"),
        ({"content": "hi", "messages": [{"role": "user", "content": "hi"}]}, "content", "invalid_value"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages", "invalid_value"),
        ({"content": "hi", "colour": "blue"}, "colour", "unknown_parameter"),
        ({"content": "a\x00b"}, "content", "invalid_value"),
        ({"content": "hi", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"content": "hi", "user": "\udc80"}, "user", "invalid_value"),
        ({"content": "hi", "stop": ["\udc80"]}, "stop", "invalid_value"),
        ({"content": "hi", "seed": 10**30}, "seed", "invalid_value"),
        ({"content": "hi", "max_tokens": 2**31}, "max_tokens", "invalid_value"),
    ],
)
async def test_bad_messages_are_400(
    http: httpx.AsyncClient, body: dict[str, object], param: str, code: str
) -> None:
    conversation = await create(http)
    # Escaped JSON, so that a lone surrogate travels as JSON allows.
    raw = json.dumps(body).encode()
    headers = {**AUTH, "content-type": "application/json"}
    resp = await http.post(f"/v1/conversations/{conversation['id']}/messages", content=raw, headers=headers)
    assert resp.status_code == 400, resp.text
    assert (resp.json()["error"]["param"], resp.json()["error"]["code"]) == (param, code)


async def test_create_checks_its_fields(http: httpx.AsyncClient) -> None:
    assert (await http.post("/v1/conversations", headers=AUTH)).status_code == 200  # no body at all
    unknown = await http.post("/v1/conversations", json={"metadata": {}}, headers=AUTH)
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "metadata")
    model = await http.post("/v1/conversations", json={"model": "no-such-model"}, headers=AUTH)
    assert (model.status_code, model.json()["error"]["code"]) == (404, "model_not_found")
    long_title = await http.post("/v1/conversations", json={"title": "t" * 1000}, headers=AUTH)
    assert (long_title.status_code, long_title.json()["error"]["param"]) == (400, "title")
    assert (await http.post("/v1/conversations", json={"title": "x"})).status_code == 401


async def test_a_deleted_conversation_is_gone(http: httpx.AsyncClient) -> None:
    cid = (await create(http))["id"]
    deleted = await http.delete(f"/v1/conversations/{cid}", headers=AUTH)
    assert deleted.status_code == 200
    assert deleted.json() == {"id": cid, "object": "conversation.deleted", "deleted": True}
    for resp in (
        await http.get(f"/v1/conversations/{cid}", headers=AUTH),
        await http.get(f"/v1/conversations/{cid}/messages", headers=AUTH),
        await http.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=AUTH),
        await http.delete(f"/v1/conversations/{cid}", headers=AUTH),
    ):
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "conversation_not_found"
    listed = (await http.get("/v1/conversations", headers=AUTH)).json()
    assert cid not in [c["id"] for c in listed["data"]]


async def test_another_tenant_cannot_see_it(stack: Stack, http: httpx.AsyncClient) -> None:
    cid = (await create(http, title="mine"))["id"]
    other = {"authorization": f"Bearer {await new_tenant(stack, 'tenant-b')}"}
    for resp in (
        await http.get(f"/v1/conversations/{cid}", headers=other),
        await http.get(f"/v1/conversations/{cid}/messages", headers=other),
        await http.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=other),
        await http.delete(f"/v1/conversations/{cid}", headers=other),
    ):
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "conversation_not_found"
    assert (await http.get("/v1/conversations", headers=other)).json()["data"] == []
    # Still there for its owner.
    assert (await http.get(f"/v1/conversations/{cid}", headers=AUTH)).status_code == 200


@pytest.mark.parametrize(
    "cid",
    [
        "conv_eu_eu-west_0123456789abcdef0123456789abcdef",  # another zone
        "conv_us_us-east_0123456789abcdef0123456789abcdef",  # this zone, never created
        "conv_garbage",
        "not-an-id",
    ],
)
async def test_unknown_malformed_and_foreign_ids_are_404(http: httpx.AsyncClient, cid: str) -> None:
    for resp in (
        await http.get(f"/v1/conversations/{cid}", headers=AUTH),
        await http.get(f"/v1/conversations/{cid}/messages", headers=AUTH),
        await http.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=AUTH),
        await http.delete(f"/v1/conversations/{cid}", headers=AUTH),
    ):
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "conversation_not_found"
