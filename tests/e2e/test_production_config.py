"""``deploy/examples/production.toml`` runs: every plane it names (two zones
of two regions, two pods each, the global plane and the edge), on
PostgreSQL stores and a database per zone of the local Redis instead of
CockroachDB and a Redis server per zone, with the
simulator for vLLM and free ports. A turn streams, a file is retrieved from
and an end user's memory is recalled into a later turn. The CockroachDB URL
of the same config reaches the database driver: a region refuses a store
that ``llmmesh db upgrade`` has not brought to this release, with one line
naming the command, and no traceback of ours."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from llmmesh.core.identity import Role, role_name
from llmmesh.v1 import policy_service_pb2, policy_service_pb2_grpc
from tests.conftest import POSTGRES_URL, REDIS_URL, _need, fresh_schema
from tests.e2e.conftest import RunningMesh, start_up, stop_up

pytestmark = pytest.mark.e2e
PRODUCTION = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "production.toml"
POLL_S, WAIT_S = 0.3, 30.0
SAYS = "My name is Greta Holm and I live in Bremen."
TEXT = "The spare bicycle of the Bremen office is kept in the basement of the town hall."


def _local(config: str, stores: dict[str, str], redis_url: str) -> str:
    """production.toml with its stores, Redis (a database per zone of one
    server, which the zones may then share), engine and ports made local."""
    zone = ""
    lines = []
    for line in config.splitlines():
        if heading := re.fullmatch(r"\[zones\.(\w+)\]", line):
            zone = heading.group(1)
        database = {"us": 5, "eu": 6}.get(zone, 4)
        line = re.sub(r'^redis_url = ".*"$', f'redis_url = "{redis_url}/{database}"', line)
        line = re.sub(r'^global_store_url = ".*"$', f'global_store_url = "{stores["global"]}"', line)
        if line.startswith("store_url = "):
            line = f'store_url = "{stores[zone]}"'
        line = re.sub(r'^backend = "vllm"$', 'backend = "sim"', line)
        line = re.sub(r"^(edge_port|global_port|port) = \d+$", r"\1 = 0", line)
        lines.append(line)
        if line == "[mesh]":
            lines.append("shared_redis_ok = true")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def production_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    _need("PostgreSQL", "127.0.0.1", 5432)
    _need("Redis", "127.0.0.1", 6379)
    home = tmp_path_factory.mktemp("llmmesh-production")
    with ExitStack() as schemas:
        stores = {name: schemas.enter_context(fresh_schema(POSTGRES_URL)) for name in ("global", "us", "eu")}
        redis_url = re.sub(r"/\d+$", "", REDIS_URL)
        config = home / "production.toml"
        config.write_text(_local(PRODUCTION.read_text(), stores, redis_url))
        running = start_up(home, "--config", str(config), "--dev-key", "sk-llmmesh-production")
        try:
            yield running
        finally:
            if running.process.poll() is None:
                status, out = stop_up(running)
                assert status == 0, out


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _enable_memory(mesh: RunningMesh, tenant_id: str) -> None:
    async with mesh.channel(str(mesh.info["global_address"]), role_name(Role.GLOBAL)) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        tenant = policy_service_pb2.Tenant(id=tenant_id, memory_enabled=True)
        request = policy_service_pb2.UpdateTenantRequest(tenant=tenant, update_fields=["memory_enabled"])
        await policy.UpdateTenant(request, timeout=10)


def test_every_plane_of_the_production_config_serves_on_postgresql_and_redis(
    production_mesh: RunningMesh,
) -> None:
    mesh = production_mesh
    planes = set(mesh.pids)
    assert {"global", "edge", "us-east", "us-west", "eu-west", "eu-central"} <= planes
    assert sum(1 for p in planes if "-pod-" in p) == 8
    assert all(str(mesh.store_url(z)).startswith("postgresql+psycopg://") for z in ("us", "eu"))
    with httpx.Client(base_url=f"{mesh.edge_url}/v1", headers=auth(mesh.key("us")), timeout=60) as http:
        # A turn streams.
        body = {
            "model": "auto",
            "max_tokens": 6,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        with http.stream("POST", "/chat/completions", json=body) as stream:
            assert stream.status_code == 200
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        assert stream.headers["x-llmmesh-region"] in mesh.regions_in("us")
        # A file is retrieved from, on the zone's PostgreSQL retrieval tables.
        uploaded = http.post(
            "/files", files={"file": ("bike.txt", TEXT.encode())}, data={"purpose": "assistants"}
        )
        assert uploaded.status_code == 200, uploaded.text
        file_id = uploaded.json()["id"]
        store = http.post("/vector_stores", json={"name": "office", "file_ids": [file_id]})
        assert store.status_code == 200, store.text
        turn = http.post(
            "/chat/completions",
            json={
                "model": "auto",
                "max_tokens": 6,
                "messages": [{"role": "user", "content": "Where is the spare bicycle kept?"}],
                "llmmesh_retrieval": {"vector_store_ids": [store.json()["id"]]},
            },
        )
        assert turn.status_code == 200, turn.text
        assert turn.json()["llmmesh_citations"][0]["file_id"] == file_id
        # An end user's facts are learned, then recalled into their next turn (more prompt).
        asyncio.run(_enable_memory(mesh, mesh.tenant_id("us")))
        said = {
            "model": "auto",
            "max_tokens": 4,
            "user": "greta",
            "messages": [{"role": "user", "content": SAYS}],
        }
        found: list[dict[str, object]] = []
        deadline = time.monotonic() + WAIT_S
        while len(found) < 2 and time.monotonic() < deadline:
            assert http.post("/chat/completions", json=said).status_code == 200
            time.sleep(POLL_S)
            found = http.get("/memories", params={"user": "greta"}).json()["data"]
        assert {str(f["content"]) for f in found} == {
            "The user's name is Greta Holm.",
            "The user lives in Bremen.",
        }

        def prompt_tokens(user: str) -> int:
            asked = {
                "model": "auto",
                "max_tokens": 2,
                "user": user,
                "messages": [{"role": "user", "content": "Who am I?"}],
            }
            resp = http.post("/chat/completions", json=asked)
            assert resp.status_code == 200, resp.text
            return int(resp.json()["usage"]["prompt_tokens"])

        assert prompt_tokens("greta") > prompt_tokens("someone-else") + 5


def test_a_region_on_the_configs_cockroachdb_url_reaches_the_driver(
    postgres_url: str, tmp_path: Path
) -> None:
    """PostgreSQL speaks the wire protocol the cockroachdb dialect drives:
    the region gets as far as reading the store's revision, and refuses."""
    with fresh_schema(postgres_url) as url:
        crdb = url.replace("postgresql+psycopg://", "cockroachdb+psycopg://")
        env = {"LLMMESH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        argv = [sys.executable, "-m", "llmmesh", "region", "--zone-store-url", crdb, "--port", "0"]
        argv += ["--engine-addresses", "127.0.0.1:9", "--insecure"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "is at revision none; this release needs 0002: run `llmmesh db upgrade`" in done.stderr
    assert PRODUCTION.read_text().count('_url = "cockroachdb+psycopg://') == 3
