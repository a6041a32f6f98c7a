"""Every edge answer, JSON, HTML or error, carries nosniff, no framing, no
referrer and a Content-Security-Policy; /docs' policy admits its one inline
style by hash and nothing else."""

from __future__ import annotations

import base64
import hashlib
import re

import httpx
import pytest

from tests.stack import DEV_KEY

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def http(shared_http: httpx.AsyncClient) -> httpx.AsyncClient:
    """One mesh for the module: its tests only read."""
    return shared_http


@pytest.mark.parametrize(
    ("path", "auth"),
    [
        ("/openapi.json", False),
        ("/docs", False),
        ("/v1/models", True),
        ("/v1/models", False),  # a 401 error object
        ("/v1/no-such-route", True),  # a 404
        ("/healthz", False),
        ("/chat", False),
    ],
)
async def test_every_answer_carries_the_security_headers(
    http: httpx.AsyncClient, path: str, auth: bool
) -> None:
    headers = {"authorization": f"Bearer {DEV_KEY}"} if auth else {}
    resp = await http.get(path, headers=headers)
    assert resp.headers["x-content-type-options"] == "nosniff", path
    assert resp.headers["x-frame-options"] == "DENY", path
    assert resp.headers["referrer-policy"] == "no-referrer", path
    policy = resp.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, path


async def test_json_loads_nothing_and_docs_only_their_own_style(http: httpx.AsyncClient) -> None:
    document = await http.get("/openapi.json")
    assert document.headers["content-security-policy"].startswith("default-src 'none'; frame-ancestors")
    docs = await http.get("/docs")
    style = re.search(r"<style>(.*?)</style>", docs.text, flags=re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    policy = docs.headers["content-security-policy"]
    assert f"style-src 'sha256-{digest}'" in policy
    assert "script-src" not in policy  # no script may run: the default refuses it


async def test_the_edge_s_root_leads_to_the_chat_page(http: httpx.AsyncClient) -> None:
    resp = await http.get("/", follow_redirects=False)
    assert (resp.status_code, resp.headers["location"]) == (307, "/chat")
    assert (await http.get("/", follow_redirects=True)).headers["content-type"].startswith("text/html")
