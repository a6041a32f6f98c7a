"""OpenAI's ``user`` (and ``safety_identifier``) through the edge: a chat
completion's and a conversation turn's end user is billed with the turn and
found by it; one the mesh cannot keep is a 400 naming ``user``."""

from __future__ import annotations

import httpx
import pytest

from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
AUTH = {"authorization": f"Bearer {DEV_KEY}"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Hello mesh."}], "max_tokens": 4}


async def _conversation(http: httpx.AsyncClient) -> str:
    created = await http.post("/v1/conversations", json={}, headers=AUTH)
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


async def _billed_to(stack: Stack, end_user: str) -> tuple[int, int]:
    """(requests, output tokens) billing holds for ``end_user`` of the dev tenant (by the
    pseudonym its zone computes), once shipped."""
    await stack.region.gateway.drain()
    assert await stack.region.shipper.flush(timeout_s=10), "usage not delivered"
    tenant = stack.region.policy.authenticate(DEV_KEY).tenant_id
    pseudonym = await stack.region.shipper.pseudonyms.of(tenant, end_user)
    totals = await stack.global_plane.ledger.usage(tenant, "", end_user=pseudonym)
    return totals.requests, totals.output_tokens


async def test_chat_and_conversation_turns_are_billed_to_their_end_user(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    chat = await http.post("/v1/chat/completions", json={**CHAT, "user": "u-chat"}, headers=AUTH)
    assert chat.status_code == 200, chat.text
    hashed = await http.post(
        "/v1/chat/completions", json={**CHAT, "safety_identifier": "u-hashed", "user": "old"}, headers=AUTH
    )
    assert hashed.status_code == 200, hashed.text
    conversation = await _conversation(http)
    turn = await http.post(
        f"/v1/conversations/{conversation}/messages",
        json={"content": "Hi.", "max_tokens": 3, "user": "u-conv"},
        headers=AUTH,
    )
    assert turn.status_code == 200, turn.text
    assert await _billed_to(stack, "u-chat") == (1, chat.json()["usage"]["completion_tokens"])
    assert await _billed_to(stack, "u-hashed") == (1, hashed.json()["usage"]["completion_tokens"])
    assert await _billed_to(stack, "old") == (0, 0)
    assert (await _billed_to(stack, "u-conv"))[0] == 1


async def test_an_end_user_the_mesh_cannot_keep_is_a_400_naming_user(http: httpx.AsyncClient) -> None:
    chat = await http.post("/v1/chat/completions", json={**CHAT, "user": "u" * 257}, headers=AUTH)
    assert chat.status_code == 400, chat.text
    assert chat.json()["error"]["param"] == "user"
    conversation = await _conversation(http)
    turn = await http.post(
        f"/v1/conversations/{conversation}/messages",
        json={"content": "Hi.", "user": "u\nforged"},
        headers=AUTH,
    )
    assert turn.status_code == 400, turn.text
    assert turn.json()["error"]["param"] == "user"
    kept = await http.post("/v1/chat/completions", json={**CHAT, "user": "u" * 256}, headers=AUTH)
    assert kept.status_code == 200, kept.text
