"""Retrieval and memory in conversation turns, through HTTP over an
in-process mesh, as in chat completions: a message with ``llmmesh_retrieval``
gets the excerpts (after the conversation's system prompt, which it keeps)
and cites them, a regeneration searches with the stored question, a store
the tenant lacks is refused, and an end user's remembered facts join their
conversation turns (and nobody else's)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.edge.sdk import async_client
from tests.edge.test_chat_retrieval import QUESTION, _store
from tests.edge.test_memories_api import auth, learned, tenant_key, turn
from tests.stack import DEV_KEY, Stack

pytestmark = pytest.mark.asyncio
MISSING = "vs_us_000000000000000000000000"


async def conversation(http: httpx.AsyncClient, key: str = DEV_KEY, **body: Any) -> str:
    resp = await http.post("/v1/conversations", json=body, headers=auth(key))
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


async def send(http: httpx.AsyncClient, cid: str, key: str = DEV_KEY, **body: Any) -> dict[str, Any]:
    resp = await http.post(
        f"/v1/conversations/{cid}/messages", json={"max_tokens": 4, **body}, headers=auth(key)
    )
    assert resp.status_code == 200, resp.text
    reply: dict[str, Any] = resp.json()
    return reply


async def test_a_conversation_turn_gets_excerpts_and_cites_them(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    async with async_client(stack) as client:
        store_id = await _store(client)
    asks = {"vector_store_ids": [store_id], "max_num_results": 2}
    plain = await send(http, await conversation(http), content=QUESTION)
    assert "llmmesh_citations" not in plain
    bare = await send(http, await conversation(http), content=QUESTION, llmmesh_retrieval=asks)
    cid = await conversation(http, system_prompt="You are the harbour office's assistant. Be brief.")
    reply = await send(http, cid, content=QUESTION, llmmesh_retrieval=asks)
    citations = reply["llmmesh_citations"]
    assert citations[0]["filename"] == "zorvel.txt" and citations[0]["marker"] == "[1]"
    assert reply["llmmesh_retrieval_degraded"] is False and len(citations) <= 2
    # The excerpts are prompt text, and the conversation's system prompt stays beside them.
    assert bare["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 15
    assert reply["usage"]["prompt_tokens"] > bare["usage"]["prompt_tokens"] + 5

    listed = await http.get(f"/v1/conversations/{cid}/messages", headers=auth(DEV_KEY))
    stored = listed.json()["data"]
    # Only the question and the reply are stored: the excerpts are context, not history.
    assert [m["role"] for m in stored] == ["user", "assistant"] and stored[0]["content"] == QUESTION
    again = await http.post(
        f"/v1/conversations/{cid}/messages/{stored[1]['id']}/regenerate",
        json={"max_tokens": 4, "stream": True, "llmmesh_retrieval": asks},
        headers=auth(DEV_KEY),
    )
    assert again.status_code == 200, again.text
    finish = [line for line in again.text.splitlines() if '"llmmesh_citations"' in line]
    assert len(finish) == 1 and '"zorvel.txt"' in finish[0]


async def test_a_conversation_turn_naming_another_store_is_refused(http: httpx.AsyncClient) -> None:
    cid = await conversation(http)
    resp = await http.post(
        f"/v1/conversations/{cid}/messages",
        json={
            "content": QUESTION,
            "llmmesh_retrieval": {"vector_store_ids": ["vs_us_000000000000000000000000"]},
        },
        headers=auth(DEV_KEY),
    )
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "vector_store_not_found"
    bad = await http.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": QUESTION, "llmmesh_retrieval": {"vector_store_ids": []}},
        headers=auth(DEV_KEY),
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "llmmesh_retrieval.vector_store_ids"


async def test_remembered_facts_join_the_users_conversation_turns(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    key = await tenant_key(stack, "remembers-in-conversations", memory=True)
    await turn(http, key, "greta")
    assert len(await learned(http, key, "greta", 2)) == 2
    question = "Where do I live?"
    hers = await send(http, await conversation(http, key), key, content=question, user="greta")
    theirs = await send(http, await conversation(http, key), key, content=question, user="someone-else")
    assert hers["usage"]["prompt_tokens"] > theirs["usage"]["prompt_tokens"] + 5
    # A conversation turn teaches facts too.
    await send(http, await conversation(http, key), key, content="I work as a ferry pilot.", user="greta")
    found = await learned(http, key, "greta", 3)
    assert "The user works as a ferry pilot." in [f["content"] for f in found]
