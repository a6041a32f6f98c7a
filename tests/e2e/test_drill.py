"""``llmmesh drill failover`` against a real ``llmmesh up`` (the default
topology, simulator pods, mutual TLS between every plane and the drill): a
region killed and partitioned, a pod killed, the global plane partitioned,
every certificate rotated twice, the mesh CA rotated; and Redis killed in a mesh that runs its
own (``--redis embedded``). Short settings; the drill's own JSON is what is
checked: every figure present, residency held, no turn lost, no token
lost or repeated, and the mesh back to serving after each drill."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import Role, role_name
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import geo_routing_service_pb2_grpc
from tests.e2e.conftest import RunningMesh, child_pids, pid_alive, start_up, stop_up
from tests.e2e.drills import FIELDS, assert_clean, drill

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def drill_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A default mesh of its own, but with no Redis (the redis drill's
    refusal needs one without; test_killing_the_embedded_redis drills the
    Redis): the drills kill and stop its processes."""
    home = tmp_path_factory.mktemp("llmmesh-drill")
    flags = ["--engine", "sim", "--edge-port", "0", "--dev-key", "sk-llmmesh-drill", "--redis", "none"]
    running = start_up(home, *flags)
    yield running
    if running.process.poll() is None:
        status, out = stop_up(running)
        assert status == 0, out


@pytest.fixture(scope="module")
def region_kill(drill_mesh: RunningMesh) -> dict[str, Any]:
    return drill(drill_mesh, "--kind", "region", "--mode", "kill")


@pytest.fixture(scope="module")
def global_outage(drill_mesh: RunningMesh) -> dict[str, Any]:
    # Longer than the edge's 5 s key cache and its 5 s routing deadline: what a real outage tests.
    return drill(drill_mesh, "--kind", "global-plane", "--outage-s", "12")


def test_killing_the_serving_region_loses_no_token(
    drill_mesh: RunningMesh, region_kill: dict[str, Any]
) -> None:
    report = region_kill
    assert_clean(report)
    # The region of the us dev tenant's zone that ran most of its turns at the moment.
    region = report["region"]
    assert (report["kind"], report["mode"]) == ("region", "kill") and region in {"us-east", "us-west"}
    assert report["streams_total"] == 8 and isinstance(report["streams_affected"], int)
    assert report["streams_affected"] >= 1
    assert report["tokens_lost"] == 0
    assert report["stall_p99_s"] is not None
    assert report["time_to_return_s"] is not None
    assert report["usage_records_lost"] == 0
    # llmmesh up restarted the region on its address, and mesh.json names the new process.
    log = drill_mesh.log()
    killed = drill_mesh.pids[region]
    assert f"region {region} (pid {killed}) exited with status -9; restarting it in" in log
    info = json.loads((drill_mesh.home / "mesh.json").read_text())
    assert info["zones"] == drill_mesh.info["zones"]
    assert info["pids"][region] != killed
    assert info["pids"][region] in child_pids(drill_mesh.process.pid)


def test_partitioning_the_serving_region_loses_no_token(drill_mesh: RunningMesh, region_kill: object) -> None:
    pids = json.loads((drill_mesh.home / "mesh.json").read_text())["pids"]
    # No --region: the drill partitions the region its turns run on at the moment (after the
    # kill, the streams' conversations may all have moved to one region and stay there).
    report = drill(drill_mesh, "--kind", "region", "--mode", "partition")
    assert_clean(report)
    assert report["mode"] == "partition" and report["tokens_lost"] == 0
    assert report["streams_affected"] >= 1 and report["stall_p99_s"] is not None
    # Continued, not restarted: the same process serves on, and runs.
    pid = pids[report["region"]]
    assert json.loads((drill_mesh.home / "mesh.json").read_text())["pids"][report["region"]] == pid
    assert pid_alive(pid) and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"


def test_killing_a_pod_loses_no_token(drill_mesh: RunningMesh, region_kill: object) -> None:
    report = drill(drill_mesh, "--kind", "pod", "--region", "us-east")
    assert_clean(report)
    assert report["kind"] == "pod"
    assert re.match(r"us-east-pod-\d+ \(pid ", report["target"]), report["target"]
    assert report["tokens_lost"] == 0


def test_a_global_plane_outage_loses_no_usage_record(global_outage: dict[str, Any]) -> None:
    report = global_outage
    assert_clean(report)
    assert (report["kind"], report["mode"]) == ("global-plane", "partition")
    assert report["tokens_lost"] == 0
    assert report["usage_records_lost"] == 0
    assert report["time_to_exclude_s"] is None and report["time_to_return_s"] is not None


def test_a_global_plane_outage_fails_no_turn(global_outage: dict[str, Any]) -> None:
    assert global_outage["turns_failed_clearly"] == 0, global_outage["errors"]


async def _regions_listed(dial: Callable[[], grpc.aio.Channel]) -> set[str]:
    async with dial() as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        listed = await geo.ListRegions(gpb.ListRegionsRequest(page_size=100), timeout=10)
    return {s.report.region for s in listed.regions}


def test_rotating_every_certificate_under_load_fails_no_turn(drill_mesh: RunningMesh) -> None:
    certs = drill_mesh.certs_dir
    leaves = sorted(p for p in certs.glob("*.pem") if p.name not in ("ca.pem", "ca-cert.pem"))
    before = {p.name: p.read_bytes() for p in [*leaves, certs / "ca.pem"]}
    report = drill(drill_mesh, "--kind", "cert-rotation", "--rotations", "2", "--rotate-every-s", "2")
    assert_clean(report)
    assert (report["kind"], report["mode"]) == ("cert-rotation", "rotate")
    assert report["turns_failed_clearly"] == 0, report["errors"]
    assert report["tokens_lost"] == 0 and report["usage_records_lost"] == 0
    assert report["cert_rotations"] == 2 and report["certificates_rotated"] == 2 * len(leaves)
    # The global plane, four regions and four pods, each asked on a new connection after each round.
    assert report["servers_checked"] == 9
    assert report["servers_presenting_new_cert"] == 9, report["servers_not_presenting_new_cert"]
    assert report["passed"] is True
    # Every leaf was re-issued by the same CA, which stays the one the planes trust.
    assert all(before[p.name] != p.read_bytes() for p in leaves)
    assert (certs / "ca.pem").read_bytes() == before["ca.pem"]
    # New connections with the rotated admin certificate are served; plaintext ones are not.
    address, name = str(drill_mesh.info["global_address"]), role_name(Role.GLOBAL)
    listed = asyncio.run(_regions_listed(lambda: drill_mesh.channel(address, name)))
    assert listed == set(drill_mesh.zone_of())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(_regions_listed(lambda: open_channel(address)))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_rotating_the_mesh_ca_under_load_fails_no_turn(drill_mesh: RunningMesh) -> None:
    certs = drill_mesh.certs_dir
    keys = drill_mesh.home / "ca"
    old_ca = (keys / "ca-cert.pem").read_bytes()
    assert not (certs / "ca.key").exists() and (keys / "ca.key").is_file()
    report = drill(drill_mesh, "--kind", "ca-rotation", "--rotate-every-s", "2")
    assert_clean(report)
    assert (report["kind"], report["mode"]) == ("ca-rotation", "rotate")
    assert report["turns_failed_clearly"] == 0, report["errors"]
    assert report["tokens_lost"] == 0 and report["usage_records_lost"] == 0
    assert report["servers_checked"] == 9
    assert report["servers_presenting_new_cert"] == 9, report["servers_not_presenting_new_cert"]
    assert report["old_ca_retired"] is True
    assert report["servers_refusing_old_ca"] == 9, report["servers_accepting_old_ca"]
    assert report["passed"] is True
    # The planes' bundle trusts the new CA alone, which issued every certificate of the directory.
    new_ca = (keys / "ca-cert.pem").read_bytes()
    assert new_ca != old_ca and (certs / "ca.pem").read_bytes() == new_ca
    address, name = str(drill_mesh.info["global_address"]), role_name(Role.GLOBAL)
    listed = asyncio.run(_regions_listed(lambda: drill_mesh.channel(address, name)))
    assert listed == set(drill_mesh.zone_of())


def test_the_drill_refuses_what_the_mesh_cannot_do(drill_mesh: RunningMesh, tmp_path: Path) -> None:
    env = {**os.environ, "LLMMESH_HOME": str(drill_mesh.home)}
    # The admin certificate without the CA that issued it: nothing to rotate with.
    for name in ("admin.pem", "admin.key", "ca.pem"):
        shutil.copy(drill_mesh.certs_dir / name, tmp_path / name)
    refusals = [
        (["--region", "mars-north"], "geo-routing knows no region 'mars-north'"),
        (["--kind", "cert-rotation", "--certs-dir", str(tmp_path)], f"{tmp_path} holds no mesh CA"),
    ]
    if "redis_url" not in drill_mesh.info:
        refusals.append((["--kind", "redis"], "this mesh runs no Redis of its own"))
    for flags, message in refusals:
        result = subprocess.run(
            [sys.executable, "-m", "llmmesh", "drill", "failover", "--json", *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and not result.stdout


def test_killing_the_embedded_redis(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("llmmesh-drill-redis")
    config = home / "mesh.toml"
    config.write_text("[mesh]\nedge_port = 0\n[zones.us.regions.us-east]\n[zones.us.regions.us-west]\n")
    running = start_up(home, "--config", str(config), "--dev-key", "sk-llmmesh-redis", "--redis", "embedded")
    try:
        redis_pid = running.pids["redis"]
        assert redis_pid in child_pids(running.process.pid)
        assert str(running.info["redis_url"]).startswith("redis://127.0.0.1:")
        report = drill(running, "--kind", "redis")
        assert set(report) >= FIELDS
        residency = report["residency"]
        assert isinstance(residency, dict) and residency["held"] is True
        assert report["turns_lost"] == 0 and report["tokens_duplicated"] == 0
        # The edge streams on without its stream log, and the region counts limits in process.
        assert report["turns_failed_clearly"] == 0, report["errors"]
        assert report["tokens_lost"] == 0
        usage = report["usage"]
        assert usage["exact"] is True and usage["difference"] == 0, usage
        assert report["passed"] is True
        assert report["restored"] is True
        assert json.loads((home / "mesh.json").read_text())["pids"]["redis"] != redis_pid
    finally:
        status, out = stop_up(running)
    assert status == 0, out
    assert not pid_alive(redis_pid)
