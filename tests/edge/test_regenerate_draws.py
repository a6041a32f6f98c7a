"""Regenerating a reply through HTTP is a fresh draw on the simulator: two
regenerations without temperature or seed give two different replies, each
stored on its own branch, while the plain (greedy) turn stays reproducible."""

from __future__ import annotations

import httpx
import pytest

from tests.edge.test_conversation_context_extras import conversation, send
from tests.edge.test_memories_api import auth
from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio
QUESTION = "Tell me about the tides of the northern sea."


async def test_two_regenerations_give_two_different_replies(http: httpx.AsyncClient) -> None:
    cid = await conversation(http)
    first = await send(http, cid, content=QUESTION, max_tokens=16)
    # The plain turn is greedy: the same question elsewhere gets the same reply.
    twin = await send(http, await conversation(http), content=QUESTION, max_tokens=16)
    assert first["choices"][0]["message"]["content"] == twin["choices"][0]["message"]["content"]
    listed = (await http.get(f"/v1/conversations/{cid}/messages", headers=auth(DEV_KEY))).json()["data"]
    answer = listed[1]["id"]
    replies = []
    for _ in range(2):
        resp = await http.post(
            f"/v1/conversations/{cid}/messages/{answer}/regenerate",
            json={"max_tokens": 16},
            headers=auth(DEV_KEY),
        )
        assert resp.status_code == 200, resp.text
        replies.append(resp.json()["choices"][0]["message"]["content"])
    assert replies[0] != replies[1]
    branches = (await http.get(f"/v1/conversations/{cid}/branches", headers=auth(DEV_KEY))).json()["data"]
    assert len(branches) == 3
