"""Conversation trees through the edge, over an in-process mesh: edit a
question, regenerate a reply, list and continue branches, and retry a
message safely with an idempotency key (one turn, one usage record)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from openai.types.chat import ChatCompletion

from llmmesh.region.zone_store import schema as zs
from tests.edge.sdk import async_client
from tests.edge.test_conversations_api import AUTH, create, sse_chunks
from tests.stack import Stack

pytestmark = pytest.mark.asyncio


async def send(
    http: httpx.AsyncClient, cid: object, headers: dict[str, str] = AUTH, **body: Any
) -> httpx.Response:
    return await http.post(
        f"/v1/conversations/{cid}/messages", json={"max_tokens": 5, **body}, headers=headers
    )


async def messages(http: httpx.AsyncClient, cid: object, leaf_id: str = "") -> list[dict[str, Any]]:
    query = f"?leaf_id={leaf_id}" if leaf_id else ""
    resp = await http.get(f"/v1/conversations/{cid}/messages{query}", headers=AUTH)
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


def usage_rows(stack: Stack, request_id: str) -> int:
    outbox = zs.usage_outbox
    query = sa.select(sa.func.count()).select_from(outbox).where(outbox.c.request_id == request_id)
    # In the store's own transaction: its planes write meanwhile.
    return int(stack.region.store.run_transaction(lambda conn: conn.execute(query).scalar_one()))


async def test_edit_regenerate_and_branches(http: httpx.AsyncClient) -> None:
    cid = (await create(http))["id"]
    assert (await send(http, cid, content="Name a fruit.")).status_code == 200
    assert (await send(http, cid, content="And a colour?")).status_code == 200
    q1, a1, q2, a2 = await messages(http, cid)
    assert (q1["parent_id"], a1["parent_id"], q2["parent_id"]) == (None, q1["id"], a1["id"])

    regenerated = await http.post(
        f"/v1/conversations/{cid}/messages/{a2['id']}/regenerate", json={"stream": True}, headers=AUTH
    )
    assert regenerated.status_code == 200, regenerated.text
    assert regenerated.headers["x-llmmesh-parent-message-id"] == q2["id"]
    assert regenerated.headers["x-llmmesh-context-summarised-turns"] == "0"
    assert regenerated.headers["x-llmmesh-context-dropped-messages"] == "0"
    chunks = sse_chunks(regenerated.text)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # type: ignore[index]
    current = await messages(http, cid)
    assert [m["id"] for m in current[:3]] == [q1["id"], a1["id"], q2["id"]]
    assert current[3]["id"] != a2["id"] and current[3]["parent_id"] == q2["id"] and len(current) == 4

    edited = await send(http, cid, content="Name a vegetable.", edit_id=q1["id"])
    assert edited.status_code == 200, edited.text
    q1b, a1b = await messages(http, cid)
    assert (q1b["content"], q1b["parent_id"]) == ("Name a vegetable.", None)

    listed = await http.get(f"/v1/conversations/{cid}/branches", headers=AUTH)
    assert listed.status_code == 200, listed.text
    branches = listed.json()
    assert branches["object"] == "list" and not branches["has_more"]
    shapes = [
        (b["object"], b["leaf_id"], b["message_count"], b["fork_id"], b["current"]) for b in branches["data"]
    ]
    assert shapes == [
        ("conversation.branch", a1b["id"], 2, None, True),
        ("conversation.branch", current[3]["id"], 4, q2["id"], False),
        ("conversation.branch", a2["id"], 4, None, False),
    ]
    assert [m["id"] for m in await messages(http, cid, leaf_id=a2["id"])] == [
        q1["id"],
        a1["id"],
        q2["id"],
        a2["id"],
    ]

    # The oldest branch goes on where asked.
    assert (await send(http, cid, content="And a shape?", parent_id=a2["id"])).status_code == 200
    assert [m["content"] for m in await messages(http, cid)][:5] == [
        "Name a fruit.",
        a1["content"],
        "And a colour?",
        a2["content"],
        "And a shape?",
    ]


async def test_branch_points_are_checked_and_named(http: httpx.AsyncClient) -> None:
    cid = (await create(http))["id"]
    assert (await send(http, cid, content="Hello.")).status_code == 200
    q1, a1 = await messages(http, cid)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"content": "x", "parent_id": "msg_missing"}, 400, "parent_id"),
        ({"content": "x", "edit_id": a1["id"]}, 400, "edit_id"),
        ({"content": "x", "edit_id": q1["id"], "parent_id": a1["id"]}, 400, "edit_id"),
        ({"content": "x", "parent_id": "not an id!"}, 400, "parent_id"),
        ({"content": "x", "client_message_id": "has space"}, 400, "client_message_id"),
    ]
    for body, status, param in cases:
        resp = await send(http, cid, **body)
        assert (resp.status_code, resp.json()["error"]["param"]) == (status, param), resp.text
    missing = await http.post(f"/v1/conversations/{cid}/messages/msg_missing/regenerate", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "message_not_found", missing.text
    extra = await http.post(
        f"/v1/conversations/{cid}/messages/{a1['id']}/regenerate", json={"content": "x"}, headers=AUTH
    )
    assert (extra.status_code, extra.json()["error"]["param"]) == (400, "content")
    # ``after`` names a branch by its leaf: a1 is one; q1, a message inside it, is not.
    paged = await http.get(f"/v1/conversations/{cid}/branches?after={a1['id']}", headers=AUTH)
    assert paged.status_code == 200 and paged.json()["data"] == [], paged.text
    inside = await http.get(f"/v1/conversations/{cid}/branches?after={q1['id']}", headers=AUTH)
    assert (inside.status_code, inside.json()["error"]["param"]) == (400, "after")
    bad_leaf = await http.get(f"/v1/conversations/{cid}/messages?leaf_id=msg_missing", headers=AUTH)
    assert (bad_leaf.status_code, bad_leaf.json()["error"]["param"]) == (400, "leaf_id")
    differ = await send(
        http, cid, headers={**AUTH, "idempotency-key": "a"}, content="x", client_message_id="b"
    )
    assert (differ.status_code, differ.json()["error"]["param"]) == (400, "client_message_id")
    assert len(await messages(http, cid)) == 2


async def test_a_retried_message_makes_one_turn_and_one_usage_record(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    cid = (await create(http))["id"]
    key = {**AUTH, "Idempotency-Key": "turn-0001"}
    first = await send(http, cid, headers=key, content="Count to three.")
    assert first.status_code == 200, first.text
    again = await send(http, cid, headers=key, content="Count to three.")
    assert again.status_code == 200, again.text
    assert again.headers["x-llmmesh-replayed"] == "true"
    one, two = first.json(), again.json()
    assert (two["id"], two["choices"][0]["message"]["content"], two["usage"]) == (
        one["id"],
        one["choices"][0]["message"]["content"],
        one["usage"],
    )
    # Streamed, the retry replays the same reply as chunks.
    streamed = await send(http, cid, headers=key, content="Count to three.", stream=True)
    chunks = sse_chunks(streamed.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])  # type: ignore[index]
    assert text == one["choices"][0]["message"]["content"]
    assert len(await messages(http, cid)) == 2
    assert usage_rows(stack, one["id"]) == 1
    # The key names that message: another one under it is refused, not answered with the old reply.
    reused = await send(http, cid, headers=key, content="Count to ten.")
    assert (reused.status_code, reused.json()["error"]["code"]) == (422, "idempotency_key_reused")

    # The same through the official SDK, with the id in the body.
    client = async_client(stack)
    body = {"content": "And to four?", "max_tokens": 5, "client_message_id": "turn-0002"}
    made = [
        await client.post(f"/conversations/{cid}/messages", body=body, cast_to=ChatCompletion)
        for _ in range(2)
    ]
    assert (
        made[0].id == made[1].id and made[0].choices[0].message.content == made[1].choices[0].message.content
    )
    assert len(await messages(http, cid)) == 4
    assert usage_rows(stack, made[0].id) == 1
    # The key is the conversation's: another conversation's turn under it is a turn of its own.
    other = (await create(http))["id"]
    elsewhere = await send(http, other, headers=key, content="Count to three.")
    assert elsewhere.status_code == 200 and elsewhere.json()["id"] != one["id"]
