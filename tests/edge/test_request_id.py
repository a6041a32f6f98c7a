"""``x-request-id`` on every edge answer: the client's own id echoed when it
is a plain token, a fresh one otherwise, on successes and errors alike; a
chat completion keeps its completion id."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.request_id import RequestIdMiddleware, answer_request_id
from tests.stack import DEV_KEY

AUTH = {"authorization": f"Bearer {DEV_KEY}"}
FRESH = re.compile(r"req_[0-9a-f]{24}")
TOKEN_CHARS = "abcXYZ0189._:-"

# --------------------------------------------------------------- the choice


@given(st.text(alphabet=TOKEN_CHARS, min_size=1, max_size=128))
def test_a_plain_token_is_echoed(sent: str) -> None:
    assert answer_request_id(sent) == sent


@given(
    st.one_of(
        st.text(alphabet=TOKEN_CHARS, min_size=129, max_size=300),
        st.text(min_size=1).filter(lambda t: not t.isascii()),
        st.text(alphabet=" /\\\"'<>\n\t%{}", min_size=1),
        st.just(""),
    )
)
def test_anything_else_gets_a_fresh_id(sent: str) -> None:
    chosen = answer_request_id(sent)
    assert chosen != sent and FRESH.fullmatch(chosen)


def test_without_a_header_each_answer_gets_its_own_fresh_id() -> None:
    ids = {answer_request_id(None) for _ in range(50)}
    assert len(ids) == 50 and all(FRESH.fullmatch(i) for i in ids)


# --------------------------------------------------------------- the middleware


def _app() -> RequestIdMiddleware:
    async def plain(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def own(request: Request) -> Response:
        return JSONResponse({"ok": True}, headers={"X-Request-Id": "chatcmpl-own"})

    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": {"message": "internal error"}}, status_code=500)

    starlette = Starlette(
        routes=[Route("/plain", plain), Route("/own", own), Route("/broken", broken)],
        exception_handlers={Exception: on_unexpected},
    )
    return RequestIdMiddleware(starlette)


@pytest_asyncio.fixture
async def asgi() -> AsyncIterator[httpx.AsyncClient]:
    # Starlette re-raises an unexpected error after answering it; the answer is what counts here.
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
        yield client


@pytest.mark.asyncio
async def test_the_middleware_adds_an_id_only_where_none_is(asgi: httpx.AsyncClient) -> None:
    plain = await asgi.get("/plain", headers={"x-request-id": "trace.7:a-b_c"})
    assert plain.headers.get_list("x-request-id") == ["trace.7:a-b_c"]
    fresh = await asgi.get("/plain", headers={"x-request-id": "not a token"})
    assert FRESH.fullmatch(fresh.headers["x-request-id"])
    own = await asgi.get("/own", headers={"x-request-id": "mine"})
    assert own.headers.get_list("x-request-id") == ["chatcmpl-own"]
    missing = await asgi.get("/nowhere")
    assert missing.status_code == 404 and FRESH.fullmatch(missing.headers["x-request-id"])
    broken = await asgi.get("/broken", headers={"x-request-id": "crash-1"})
    assert broken.status_code == 500 and broken.headers["x-request-id"] == "crash-1"


# --------------------------------------------------------------- the edge


async def _conversation_answers(http: httpx.AsyncClient, headers: dict[str, str]) -> list[httpx.Response]:
    """One answer of every conversation route but the turn's."""
    created = await http.post("/v1/conversations", json={"title": "ids"}, headers=headers)
    assert created.status_code == 200, created.text
    cid = created.json()["id"]
    answers = [
        created,
        await http.get(f"/v1/conversations/{cid}", headers=headers),
        await http.get("/v1/conversations", headers=headers),
        await http.get(f"/v1/conversations/{cid}/messages", headers=headers),
        await http.delete(f"/v1/conversations/{cid}", headers=headers),
    ]
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    return answers


@pytest.mark.asyncio
async def test_conversation_answers_carry_fresh_ids(http: httpx.AsyncClient) -> None:
    ids = [a.headers.get("x-request-id", "") for a in await _conversation_answers(http, AUTH)]
    assert all(FRESH.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)


@pytest.mark.asyncio
async def test_conversation_answers_echo_the_clients_id(http: httpx.AsyncClient) -> None:
    answers = await _conversation_answers(http, {**AUTH, "x-request-id": "client-42:retry.1"})
    assert [a.headers.get_list("x-request-id") for a in answers] == [["client-42:retry.1"]] * 5


@pytest.mark.asyncio
async def test_a_malformed_client_id_is_replaced(http: httpx.AsyncClient) -> None:
    for sent in ("x" * 129, "two words", "semi;colon"):
        resp = await http.get("/v1/conversations", headers={**AUTH, "x-request-id": sent})
        assert resp.status_code == 200
        assert FRESH.fullmatch(resp.headers["x-request-id"]), sent


@pytest.mark.asyncio
async def test_errors_carry_the_id(http: httpx.AsyncClient) -> None:
    sent = {"x-request-id": "err-1"}
    missing = await http.get("/v1/conversations/conv_us_us-east_0123456789abcdef", headers={**AUTH, **sent})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "conversation_not_found"
    bad_limit = await http.get("/v1/conversations", params={"limit": "0"}, headers={**AUTH, **sent})
    assert bad_limit.status_code == 400 and bad_limit.json()["error"]["param"] == "limit"
    no_key = await http.post("/v1/conversations", json={}, headers=sent)
    assert no_key.status_code == 401
    for resp in (missing, bad_limit, no_key):
        assert resp.headers.get_list("x-request-id") == ["err-1"]
    unknown_route = await http.get("/v1/nowhere", headers=AUTH)
    assert unknown_route.status_code == 404 and FRESH.fullmatch(unknown_route.headers["x-request-id"])


@pytest.mark.asyncio
async def test_a_completion_keeps_its_completion_id(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        headers={**AUTH, "x-request-id": "client-7"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers.get_list("x-request-id") == [resp.json()["id"]]
    assert resp.json()["id"].startswith("chatcmpl-")
