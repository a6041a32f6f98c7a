"""The edge's newer routes as an attacker reaches them: bodies past the
edge's limit sent chunked (declaring no size), another tenant's
conversation branches by id, a branch point from another conversation,
the operator API with a tenant's key, and paths out of /web."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llmmesh.edge.server import start_edge
from llmmesh.edge.settings import EdgeSettings
from tests.edge.test_conversations_api import new_tenant
from tests.stack import DEV_KEY, Stack, running_stack

pytestmark = pytest.mark.asyncio

LIMIT = 64 * 1024
OPS_KEY = "ops-key-surfaces"


@pytest_asyncio.fixture
async def mesh() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    """A mesh whose edge takes bodies of at most LIMIT bytes and has an operator key."""
    async with running_stack() as stack:
        edge = await start_edge(
            EdgeSettings(
                port=0,
                global_address=stack.global_plane.address,
                auth_cache_ms=0,
                insecure=True,
                max_body_bytes=LIMIT,
                ops_key=OPS_KEY,
            )
        )
        try:
            async with httpx.AsyncClient(base_url=edge.url, timeout=30) as http:
                yield stack, http
        finally:
            await edge.stop()


def _auth(key: str = DEV_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _chunked(data: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    """``data`` as a chunked body: no Content-Length declares its size."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _error(resp: httpx.Response) -> tuple[int, Any]:
    return resp.status_code, resp.json()["error"]["code"]


def _multipart(content: bytes) -> tuple[bytes, str]:
    boundary = "surfaces-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


async def test_a_chunked_upload_past_the_limit_is_refused_and_not_stored(
    mesh: tuple[Stack, httpx.AsyncClient],
) -> None:
    _, http = mesh
    # Past the edge's limit, well within the region's own file limit: only the edge stands in the way.
    body, content_type = _multipart(b"a" * (4 * LIMIT))
    headers = {**_auth(), "content-type": content_type}
    chunked = await http.post("/v1/files", content=_chunked(body), headers=headers)
    assert _error(chunked) == (400, "request_too_large"), chunked.text
    declared = await http.post("/v1/files", content=body, headers=headers)
    assert declared.status_code == 400, declared.text
    assert (await http.get("/v1/files", headers=_auth())).json()["data"] == []
    small, content_type = _multipart(b"fits")
    fits = await http.post(
        "/v1/files", content=_chunked(small), headers={**_auth(), "content-type": content_type}
    )
    assert fits.status_code == 200, fits.text


async def test_a_chunked_json_body_past_the_limit_is_refused(mesh: tuple[Stack, httpx.AsyncClient]) -> None:
    _, http = mesh
    filler = b'{"model": "auto", "messages": [{"role": "user", "content": "' + b"x" * (2 * LIMIT) + b'"}]}'
    headers = {**_auth(), "content-type": "application/json"}
    for path in ("/v1/chat/completions", "/v1/conversations", "/v1/embeddings", "/v1/vector_stores"):
        resp = await http.post(path, content=_chunked(filler), headers=headers)
        assert _error(resp) == (400, "request_too_large"), (path, resp.text)


async def test_another_tenant_s_conversation_and_branch_points_are_not_reachable(
    mesh: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, http = mesh
    rival = await new_tenant(stack, "rival-branches")
    first = (await http.post("/v1/conversations", json={}, headers=_auth())).json()["id"]
    other = (await http.post("/v1/conversations", json={}, headers=_auth())).json()["id"]
    said = await http.post(
        f"/v1/conversations/{first}/messages", json={"content": "my secret", "max_tokens": 4}, headers=_auth()
    )
    assert said.status_code == 200, said.text
    stored = (await http.get(f"/v1/conversations/{first}/messages", headers=_auth())).json()["data"]
    foreign = stored[-1]["id"]
    # A message of the first conversation as the branch point of the second.
    for field in ("parent_id", "edit_id"):
        resp = await http.post(
            f"/v1/conversations/{other}/messages", json={"content": "x", field: foreign}, headers=_auth()
        )
        assert (resp.status_code, resp.json()["error"]["param"]) == (400, field), resp.text
    again = await http.post(f"/v1/conversations/{other}/messages/{foreign}/regenerate", headers=_auth())
    assert again.status_code == 404, again.text
    # The rival, by id: no conversation, messages, branches or turn.
    for path in (
        f"/v1/conversations/{first}",
        f"/v1/conversations/{first}/messages",
        f"/v1/conversations/{first}/branches",
        f"/v1/conversations/{first}/messages?leaf_id={foreign}",
    ):
        assert (await http.get(path, headers=_auth(rival))).status_code == 404, path
    turn = await http.post(
        f"/v1/conversations/{first}/messages",
        json={"content": "x", "parent_id": foreign},
        headers=_auth(rival),
    )
    assert turn.status_code == 404, turn.text
    assert (await http.delete(f"/v1/conversations/{first}", headers=_auth(rival))).status_code == 404
    assert (await http.get(f"/v1/conversations/{other}/messages", headers=_auth())).json()["data"] == []
    assert len((await http.get(f"/v1/conversations/{first}/messages", headers=_auth())).json()["data"]) == 2


async def test_the_operator_api_opens_to_the_operator_key_only(mesh: tuple[Stack, httpx.AsyncClient]) -> None:
    _, http = mesh
    for path in ("/ops/api/regions", "/ops/api/usage?tenant_id=dev"):
        assert _error(await http.get(path, headers=_auth())) == (401, "invalid_operator_key"), path
        assert (await http.get(path, headers=_auth(OPS_KEY))).status_code == 200, path


async def test_nothing_outside_the_web_assets_is_served(mesh: tuple[Stack, httpx.AsyncClient]) -> None:
    _, http = mesh
    for name in (
        "..%2fapp.py",
        "%2e%2e%2fsettings.py",
        "..%5capp.py",
        "chat.html",
        "ops.html",
        "api.js%00.py",
    ):
        resp = await http.get(f"/web/{name}")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", name
    for path in ("/web/../app.py", "/web/web/../../server.py", "/web/"):
        resp = await http.get(path)
        assert resp.status_code == 404, path
        assert "import" not in resp.text, path
