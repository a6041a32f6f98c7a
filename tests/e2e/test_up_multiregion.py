"""``llmmesh up`` runs a multi-region mesh: the default topology (zones us and
eu, two regions each) as real processes, every region serving in
geo-routing, each zone's dev tenant served by its own zone; a topology from
``--config`` on PostgreSQL zone stores and Redis; bad configs refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.e2e.conftest import (
    NO_TENANT_ROWS,
    RunningMesh,
    child_pids,
    pid_alive,
    served_requests,
    start_up,
    stop_up,
    tenant_rows,
)

pytestmark = pytest.mark.e2e

ZONES = {"us": {"us-east", "us-west"}, "eu": {"eu-west", "eu-central"}}


def chat(mesh: RunningMesh, key: str, *, stream: bool = False) -> httpx.Response:
    body = {
        "model": "auto",
        "stream": stream,
        "max_tokens": 6,
        "messages": [{"role": "user", "content": "Hi!"}],
    }
    resp = httpx.post(
        mesh.edge_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    return resp


def test_mesh_json_maps_zones_regions_tenants_and_processes(mesh: RunningMesh) -> None:
    info = mesh.info
    assert info["zone"] == "us"
    zones = info["zones"]
    assert isinstance(zones, dict) and set(zones) == set(ZONES)
    for zone, detail in zones.items():
        assert set(detail["regions"]) == ZONES[zone]
        assert detail["store_url"] == f"sqlite:///{mesh.home / f'zone-{zone}.db'}"
        for region, entry in detail["regions"].items():
            assert entry["pods"] == [f"{region}-pod-0"]
            assert entry["chat_address"].startswith("127.0.0.1:")
    assert mesh.zone_of() == {region: zone for zone, regions in ZONES.items() for region in regions}
    assert info["keys"] == {"us": "sk-llmmesh-e2e", "eu": "sk-llmmesh-e2e-eu"}
    tenants = info["tenants"]
    assert isinstance(tenants, dict) and {z: t["name"] for z, t in tenants.items()} == {
        "us": "dev",
        "eu": "dev-eu",
    }
    assert mesh.tenant_id("us") != mesh.tenant_id("eu")
    planes = {"global", "edge"} | set(mesh.zone_of()) | {f"{r}-pod-0" for r in mesh.zone_of()}
    # The mesh's own Redis, one per zone, where installed ("redis": the dev zone's).
    planes |= {"redis", "redis-us", "redis-eu"} if "redis_url" in info else set()
    assert set(mesh.pids) == planes
    assert set(mesh.pids.values()) == set(child_pids(mesh.process.pid))


def test_geo_routing_lists_every_region_serving_in_its_zone(mesh: RunningMesh) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmmesh", "admin", "regions", "--json"],
        env={**os.environ, "LLMMESH_HOME": str(mesh.home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = {r["report"]["region"]: r for r in json.loads(result.stdout)}
    assert set(listed) == set(mesh.zone_of())
    for region, status in listed.items():
        assert status["report"]["zone"] == mesh.zone_of()[region]
        assert status["effective_health"] == "HEALTH_STATE_SERVING"
        assert status["report"]["healthy_engine_pods"] == 1


@pytest.mark.parametrize("zone", ["us", "eu"])
def test_each_zones_dev_tenant_is_served_in_its_zone(mesh: RunningMesh, zone: str) -> None:
    seen = set()
    for _ in range(4):
        resp = chat(mesh, mesh.key(zone))
        assert resp.status_code == 200, resp.text
        seen.add(resp.headers["x-llmmesh-region"])
        assert resp.json()["choices"][0]["message"]["content"]
    assert seen <= ZONES[zone]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_an_eu_turn_through_the_edge(mesh: RunningMesh) -> None:
    body = json.dumps(
        {
            "model": "auto",
            "stream": True,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Hallo!"}],
        }
    )
    result = subprocess.run(
        ["curl", "-sS", "-N", "-D", "-", mesh.edge_url + "/v1/chat/completions",
         "-H", f"authorization: Bearer {mesh.key('eu')}", "-H", "content-type: application/json", "-d", body],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # Text mode reads curl's CRLF header lines as plain newlines.
    head, _, stream = result.stdout.partition("\n\n")
    region = next(
        line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("x-llmmesh-region")
    )
    assert region in ZONES["eu"]
    events = [e for e in stream.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.split("data: ", 1)[1]) for e in events[:-1]]
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_bad_config_exits_2_with_one_line_and_starts_nothing(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[zones.us.regions.us-east]\n[zones.eu.regions.us-east]\n")
    result = subprocess.run(
        [sys.executable, "-m", "llmmesh", "up", "--config", str(config)],
        env={**os.environ, "LLMMESH_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"llmmesh up: {config}: region 'us-east' is in two zones: us and eu"
    assert not (tmp_path / "mesh.json").exists()


# ------------------------------------------------------------ a config of its own


@pytest.fixture
def zone_schemas(postgres_url: str) -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL schema per zone (a store URL each), dropped afterwards."""
    names = {zone: f"llmmesh_e2e_{zone}_{uuid.uuid4().hex[:8]}" for zone in ZONES}
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        for name in names.values():
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    try:
        yield {zone: f"{postgres_url}?options=-csearch_path%3D{name}" for zone, name in names.items()}
    finally:
        with admin.begin() as conn:
            for name in names.values():
                conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        admin.dispose()


@pytest.mark.services
def test_a_config_on_postgresql_stores_and_redis(
    tmp_path_factory: pytest.TempPathFactory, zone_schemas: dict[str, str], redis_url: str
) -> None:
    home = tmp_path_factory.mktemp("llmmesh-pg")
    config = home / "mesh.toml"
    config.write_text(
        # One test Redis: a database per zone, which the zones may then share.
        f'[mesh]\nedge_port = 0\nredis_url = "{redis_url}"\nshared_redis_ok = true\n'
        f'[zones.eu]\nstore_url = "{zone_schemas["eu"]}"\n[zones.eu.regions.eu-west]\n'
        f'[zones.us]\nstore_url = "{zone_schemas["us"]}"\n[zones.us.regions.us-east]\npods = 2\n'
    )
    running = start_up(home, "--config", str(config), "--zone", "us", "--dev-key", "sk-llmmesh-pg")
    try:
        # The dev zone's region first, for single-region readers of mesh.json.
        assert list(running.zone_of().items()) == [("us-east", "us"), ("eu-west", "eu")]
        assert len(child_pids(running.process.pid)) == 1 + 3 + 2 + 1
        eu = chat(running, running.key("eu"))
        assert eu.status_code == 200, eu.text
        assert eu.headers["x-llmmesh-region"] == "eu-west"
        eu_id = eu.json()["id"]
        assert served_requests(zone_schemas["eu"]) == {"eu-west": {eu_id}}
        assert served_requests(zone_schemas["us"]) == {}
        assert tenant_rows(zone_schemas["us"], running.tenant_id("eu")) == NO_TENANT_ROWS
        us = chat(running, running.api_key, stream=True)
        assert us.status_code == 200 and us.text.rstrip().endswith("data: [DONE]")
        assert us.headers["x-llmmesh-region"] == "us-east"
    finally:
        pids = list(running.pids.values())
        status, out = stop_up(running)
    assert status == 0, out
    assert not [pid for pid in pids if pid_alive(pid)]
