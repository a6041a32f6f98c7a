"""The operator API refuses everyone but the edge's operator key, and refuses
bad parameters by name, before it asks the mesh anything; its time series
holds the turns and refusals the edge saw, and the regions' reported load;
the pages are served with their Content-Security-Policy and nothing else
under /web/ is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from llmmesh.core.certs import CertFiles, CertificateAuthority
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity, TlsSetupError
from llmmesh.edge import web_routes
from llmmesh.edge.app import build_app
from llmmesh.edge.mesh_client import MeshClient
from llmmesh.edge.server import ops_admin_security
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.traffic_series import RegionLoadSampler, TrafficSeries
from llmmesh.edge.web_routes import ASSETS, CONTENT_SECURITY_POLICY
from tests.stack import DEV_KEY, Stack

OPS_KEY = "ops-key-unit"


async def _client(ops_key: str, global_address: str = "127.0.0.1:1") -> AsyncIterator[httpx.AsyncClient]:
    # By default nothing listens at the global address: every answer is the edge's own.
    settings = EdgeSettings(port=0, global_address=global_address, insecure=True, ops_key=ops_key)
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
    for path in ("/ops/api/regions", "/ops/api/usage?tenant_id=t", "/ops/api/timeseries"):
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
    assert _code(await edge.get("/ops/api/timeseries")) == (401, "missing_operator_key", None)
    assert _code(await edge.get("/ops/api/timeseries", headers=wrong)) == (401, "invalid_operator_key", None)


@pytest.mark.asyncio
async def test_bad_operator_parameters_are_refused_by_name(edge: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {OPS_KEY}"}
    cases = {
        "/ops/api/usage": (400, "invalid_value", "tenant_id"),
        "/ops/api/usage?tenant_id=a%20b": (400, "invalid_value", "tenant_id"),
        "/ops/api/usage?tenant_id=t&period=2026-13": (400, "invalid_value", "period"),
        "/ops/api/usage?tenant_id=t&user=x": (400, "unknown_parameter", "user"),
        "/ops/api/regions?zone=eu": (400, "unknown_parameter", "zone"),
        "/ops/api/timeseries?window=5": (400, "invalid_value", "window"),
        "/ops/api/timeseries?window=3601": (400, "invalid_value", "window"),
        "/ops/api/timeseries?window=1h": (400, "invalid_value", "window"),
        "/ops/api/timeseries?region=x": (400, "unknown_parameter", "region"),
    }
    for path, expected in cases.items():
        assert _code(await edge.get(path, headers=auth)) == expected, path


def _totals(view: dict[str, object]) -> tuple[int, dict[str, int]]:
    """Turns started in the window, of every series; and error answers by code."""
    series = view["series"]
    errors = view["errors"]
    assert isinstance(series, list) and isinstance(errors, dict)
    return sum(sum(row["requests"]) for row in series), {code: sum(n) for code, n in errors.items()}


@pytest.mark.asyncio
async def test_the_time_series_holds_the_turns_the_edge_saw(stack: Stack) -> None:
    assert stack.edge is not None
    auth = {"Authorization": f"Bearer {OPS_KEY}"}
    body = {"model": "auto", "messages": [{"role": "user", "content": "Chart me."}], "max_tokens": 6}
    async for ops in _client(OPS_KEY, stack.global_plane.address):
        before = (await ops.get("/ops/api/timeseries?window=3600", headers=auth)).json()
        async with httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client:
            for stream in (False, False, True):
                resp = await client.post(
                    "/v1/chat/completions",
                    json={**body, "stream": stream},
                    headers={"Authorization": f"Bearer {DEV_KEY}"},
                )
                assert resp.status_code == 200, resp.text
            refused = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": "Bearer no"}
            )
            assert refused.status_code == 401
        # Counted over the same hour as before: the series is the process's, and
        # turns of earlier test files may have left the last ten minutes meanwhile.
        hour = (await ops.get("/ops/api/timeseries?window=3600", headers=auth)).json()
        resp = await ops.get("/ops/api/timeseries?window=600", headers=auth)
        assert resp.status_code == 200, resp.text
        after = resp.json()
    assert after["object"] == "ops.timeseries" and after["interval_s"] == 10 and after["window_s"] == 600
    assert len(after["timestamps"]) == 60
    (r0, e0), (r1, e1) = _totals(before), _totals(hour)
    assert r1 - r0 == 3, (before, after)
    assert e1["invalid_api_key"] - e0.get("invalid_api_key", 0) == 1
    # The turns' latest interval (they may straddle two).
    row, i = max(
        ((row, i) for row in after["series"] for i, n in enumerate(row["requests"]) if n),
        key=lambda found: found[1],
    )
    assert row["region"] == "us-east" and row["model"], row
    assert all(len(row[k]) == 60 for k in ("output_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s"))
    assert row["output_tokens_per_s"][i] > 0 and 0 < row["ttft_p50_s"][i] <= row["ttft_p90_s"][i], row
    assert row["itl_p50_s"][i] is not None and row["itl_p50_s"][i] >= 0
    assert after["tenants"], "the tenant of the dev key was seen"

    # The regions' load, as the directory holds it, sampled into the series.
    series = TrafficSeries()
    mesh = MeshClient(stack.global_plane.address)
    try:
        await RegionLoadSampler(mesh.list_regions, series).sample()
    finally:
        await mesh.close()
    (load,) = series.window(10).regions
    assert load.region == "us-east" and load.healthy_engine_pods == [1] and load.capacity[0]


@pytest.mark.asyncio
async def test_pages_and_assets_carry_the_policy(edge: httpx.AsyncClient) -> None:
    for path in ("/chat", "/ops", *(f"/web/{name}" for name in ASSETS)):
        resp = await edge.get(path)
        assert resp.status_code == 200 and resp.content, path
        assert resp.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert resp.headers["x-content-type-options"] == "nosniff"
    for name in ("chat.html", "../app.py", "%2e%2e%2fapp.py", "nope.js"):
        assert _code(await edge.get(f"/web/{name}"))[:2] == (404, "not_found"), name


@pytest.mark.asyncio
async def test_pages_not_built_are_a_clear_503(
    edge: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> bytes:
        raise FileNotFoundError(name)

    monkeypatch.setattr(web_routes, "_read", missing)
    for path in ("/chat", "/web/chat.js"):
        resp = await edge.get(path)
        assert _code(resp) == (503, "web_pages_not_built", None), path
        assert "npm run build" in resp.json()["error"]["message"]


@pytest.mark.asyncio
async def test_key_routes_need_the_operator_key_and_an_admin_identity(
    edge: httpx.AsyncClient, closed_edge: httpx.AsyncClient
) -> None:
    routes = (
        ("GET", "/ops/api/tenants/t/keys"),
        ("POST", "/ops/api/tenants/t/keys"),
        ("POST", "/ops/api/keys/k/revoke"),
    )
    auth = {"Authorization": f"Bearer {OPS_KEY}"}
    for method, path in routes:
        resp = await closed_edge.request(method, path, headers={"Authorization": "Bearer anything"})
        assert _code(resp) == (403, "operator_api_disabled", None), path
        assert _code(await edge.request(method, path)) == (401, "missing_operator_key", None), path
        resp = await edge.request(method, path, headers=auth)
        assert _code(resp) == (403, "ops_admin_not_configured", None), path
        assert "ops_admin_cert_file" in resp.json()["error"]["message"]


def test_an_admin_identity_needs_an_operator_key_and_mtls() -> None:
    with pytest.raises(ValueError, match="set ops_key"):
        EdgeSettings(ops_admin_cert_file="a.pem", ops_admin_key_file="a.key")
    with pytest.raises(ValueError, match="insecure"):
        EdgeSettings(ops_admin_cert_file="a.pem", ops_admin_key_file="a.key", ops_key="k", insecure=True)
    with pytest.raises(ValueError, match="go together"):
        EdgeSettings(ops_admin_cert_file="a.pem", ops_key="k")


@pytest.mark.asyncio
async def test_an_edge_with_an_admin_identity_creates_lists_and_revokes_keys(stack: Stack) -> None:
    assert stack.edge is not None
    auth = {"Authorization": f"Bearer {OPS_KEY}"}
    settings = EdgeSettings(port=0, global_address=stack.global_plane.address, insecure=True, ops_key=OPS_KEY)
    # A plaintext mesh trusts every caller, so an insecure admin channel acts as admin.
    mesh = MeshClient(settings.global_address, admin_security=MeshSecurity.insecure())
    transport = httpx.ASGITransport(app=build_app(settings, mesh))
    try:
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://edge") as ops,
            httpx.AsyncClient(base_url=stack.edge.url, timeout=30) as client,
        ):
            tenant_id = (await mesh.authenticate(DEV_KEY)).tenant.id
            created = await ops.post(f"/ops/api/tenants/{tenant_id}/keys", headers=auth)
            assert created.status_code == 201, created.text
            assert created.headers["cache-control"] == "no-store"
            key, secret = created.json()["key"], created.json()["secret"]
            assert (
                key["tenant_id"] == tenant_id and secret.startswith(key["prefix"]) and key["revoked"] is None
            )
            listed = (await ops.get(f"/ops/api/tenants/{tenant_id}/keys", headers=auth)).json()
            assert listed["object"] == "list" and key["id"] in {k["id"] for k in listed["data"]}
            assert secret not in str(listed)

            body = {"model": "auto", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
            # A fresh key, never authenticated before it is revoked: no edge cache trusts it.
            revoked = await ops.post(f"/ops/api/keys/{key['id']}/revoke", headers=auth)
            assert revoked.status_code == 200 and revoked.json()["revoked"], revoked.text
            resp = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
            )
            assert resp.status_code == 401, resp.text
            listed = (await ops.get(f"/ops/api/tenants/{tenant_id}/keys", headers=auth)).json()
            assert next(k for k in listed["data"] if k["id"] == key["id"])["revoked"]

            missing = await ops.post("/ops/api/keys/key_nope/revoke", headers=auth)
            assert missing.status_code == 404, missing.text
            bad = await ops.get("/ops/api/tenants/a%20b/keys", headers=auth)
            assert _code(bad) == (400, "invalid_value", "tenant")
    finally:
        await mesh.close()


def test_the_edge_refuses_an_admin_file_that_is_no_admin_identity(tmp_path: Path) -> None:
    ca = CertificateAuthority.open(tmp_path / "certs", ca_dir=tmp_path / "ca")
    edge = ca.issue(PlaneIdentity(Role.EDGE, "edge"))
    admin = ca.issue(PlaneIdentity(Role.ADMIN, "admin"))
    security = MeshSecurity.mtls(edge)

    def settings(files: CertFiles) -> EdgeSettings:
        return EdgeSettings(
            ops_key="k", ops_admin_cert_file=str(files.cert), ops_admin_key_file=str(files.key)
        )

    held = ops_admin_security(settings(admin), security)
    assert held is not None and held.identity == PlaneIdentity(Role.ADMIN, "admin")
    with pytest.raises(TlsSetupError, match="not an admin identity"):
        ops_admin_security(settings(edge), security)
    assert ops_admin_security(EdgeSettings(), security) is None
