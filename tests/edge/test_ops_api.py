"""The operator API refuses everyone but the edge's operator key, and refuses
bad parameters by name, before it asks the mesh anything; the pages are
served with their Content-Security-Policy and nothing else under /web/ is."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from llmmesh.edge.app import build_app
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.web_routes import ASSETS, CONTENT_SECURITY_POLICY

OPS_KEY = "ops-key-unit"


async def _client(ops_key: str) -> AsyncIterator[httpx.AsyncClient]:
    # Nothing listens at the global address: every answer here is the edge's own.
    settings = EdgeSettings(port=0, global_address="127.0.0.1:1", insecure=True, ops_key=ops_key)
    mesh = MeshClient(settings.global_address)
    transport = httpx.ASGITransport(app=build_app(settings, mesh))
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
        yield client
    await mesh.close()


@pytest_asyncio.fixture
async def edge() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(OPS_KEY):
        yield client


@pytest_asyncio.fixture
async def closed_edge() -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(""):
        yield client


def _code(resp: httpx.Response) -> tuple[int, str, str | None]:
    error = resp.json()["error"]
    return resp.status_code, error["code"], error["param"]


@pytest.mark.asyncio
async def test_an_edge_without_an_operator_key_refuses_every_operator_request(
    closed_edge: httpx.AsyncClient,
) -> None:
    for path in ("/ops/api/regions", "/ops/api/usage?tenant_id=t"):
        resp = await closed_edge.get(path, headers={"Authorization": "Bearer anything"})
        assert _code(resp) == (403, "operator_api_disabled", None), resp.text
        assert "LLMMESH_OPS_KEY" in resp.json()["error"]["message"]


@pytest.mark.asyncio
async def test_only_the_operator_key_opens_the_operator_api(edge: httpx.AsyncClient) -> None:
    assert _code(await edge.get("/ops/api/regions")) == (401, "missing_operator_key", None)
    wrong = {"Authorization": "Bearer sk-llmmesh-dev"}
    assert _code(await edge.get("/ops/api/regions", headers=wrong)) == (401, "invalid_operator_key", None)
    basic = {"Authorization": f"Basic {OPS_KEY}"}
    assert _code(await edge.get("/ops/api/regions", headers=basic)) == (401, "missing_operator_key", None)


@pytest.mark.asyncio
async def test_bad_operator_parameters_are_refused_by_name(edge: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {OPS_KEY}"}
    cases = {
        "/ops/api/usage": (400, "invalid_value", "tenant_id"),
        "/ops/api/usage?tenant_id=a%20b": (400, "invalid_value", "tenant_id"),
        "/ops/api/usage?tenant_id=t&period=2026-13": (400, "invalid_value", "period"),
        "/ops/api/usage?tenant_id=t&user=x": (400, "unknown_parameter", "user"),
        "/ops/api/regions?zone=eu": (400, "unknown_parameter", "zone"),
    }
    for path, expected in cases.items():
        assert _code(await edge.get(path, headers=auth)) == expected, path


@pytest.mark.asyncio
async def test_pages_and_assets_carry_the_policy(edge: httpx.AsyncClient) -> None:
    for path in ("/chat", "/ops", *(f"/web/{name}" for name in ASSETS)):
        resp = await edge.get(path)
        assert resp.status_code == 200 and resp.content, path
        assert resp.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert resp.headers["x-content-type-options"] == "nosniff"
    for name in ("chat.html", "../app.py", "%2e%2e%2fapp.py", "nope.js"):
        assert _code(await edge.get(f"/web/{name}"))[:2] == (404, "not_found"), name
