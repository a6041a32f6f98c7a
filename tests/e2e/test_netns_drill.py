"""The mesh on separate hosts: ``llmmesh up --netns`` runs the global plane,
the edge and each region with its pods in a Linux network namespace of its
own (veth pairs on a bridge, own addresses), and ``llmmesh drill failover
--mode link-down`` partitions the serving region by taking its link down;
``--kind partition-global`` cuts the serving region off from the global
plane alone, and the edge, which still reaches it, keeps it serving its zone.

Checked: every plane serves and registers its host's address (never a
loopback one), every hop's traffic went through the hosts' links (their
byte counters), the drill loses and repeats no token, and the namespaces
and links are gone once the mesh stops. Needs root and iproute2; CI has both.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from llmmesh.core.addresses import split_host_port
from llmmesh.core.identity import Role, role_name
from llmmesh.topology.netns import netns_available
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import geo_routing_service_pb2_grpc
from tests.e2e.conftest import RunningMesh, start_up, stop_up
from tests.e2e.drills import assert_clean
from tests.e2e.drills import drill as run_drill

pytestmark = pytest.mark.e2e

SHORT = [
    "--streams", "24", "--max-tokens", "64", "--disrupt-after-s", "3", "--restore-after-s", "5",
    "--duration-s", "3", "--turn-timeout-s", "60", "--restore-timeout-s", "90", "--usage-wait-s", "30",
]  # fmt: skip
DRILL_TIMEOUT_S = 180.0
RESTART_TIMEOUT_S = 60.0


def _require_netns() -> None:
    why = netns_available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the netns drill: {why}")
        pytest.skip(why)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False).stdout


def _link_bytes(link: str) -> int:
    stats = Path("/sys/class/net") / link / "statistics"
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


@pytest.fixture(scope="module")
def netns_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A default mesh on six hosts, without Redis like the other drills' mesh."""
    _require_netns()
    home = tmp_path_factory.mktemp("llmmesh-netns")
    flags = ["--netns", "--engine", "sim", "--edge-port", "0", "--dev-key", "sk-llmmesh-netns"]
    running = start_up(home, *flags, "--redis", "none")
    netns = running.info["netns"]
    assert isinstance(netns, dict)
    try:
        yield running
    finally:
        try:
            status, out = stop_up(running)
        finally:
            left = _leftovers(netns)
            # Only this run's names: a mesh that could not clean up must not leak into the next run.
            for name in left:
                if name.startswith("llmmesh-"):
                    _ip("netns", "del", name)
                else:
                    _ip("link", "del", name)
    assert status == 0, out
    # Removed on exit: no namespace and no link of this run is left behind.
    assert left == [], left


def _leftovers(netns: dict[str, Any]) -> list[str]:
    namespaces, links = _ip("netns", "list").split(), _ip("-o", "link", "show")
    left = [h["netns"] for h in netns["hosts"].values() if h["netns"] in namespaces]
    names = [*(h["link"] for h in netns["hosts"].values()), netns["bridge"]]
    return left + [n for n in names if f" {n}@" in links or f" {n}:" in links]


def hosts(mesh: RunningMesh) -> dict[str, dict[str, str]]:
    netns = mesh.info["netns"]
    assert isinstance(netns, dict)
    found: dict[str, dict[str, str]] = netns["hosts"]
    return found


def host_of(address: str) -> str:
    return split_host_port(address)[0]


async def listed_regions(mesh: RunningMesh) -> dict[str, str]:
    """Every region's chat_address as geo-routing lists it."""
    async with mesh.channel(str(mesh.info["global_address"]), role_name(Role.GLOBAL)) as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        listed = await geo.ListRegions(gpb.ListRegionsRequest(page_size=100), timeout=10)
    return {s.report.region: s.report.chat_address for s in listed.regions}


def drill(mesh: RunningMesh, *flags: str) -> dict[str, Any]:
    return run_drill(mesh, *flags, settings=SHORT, timeout_s=DRILL_TIMEOUT_S)


def test_every_plane_serves_and_registers_its_own_hosts_address(netns_mesh: RunningMesh) -> None:
    by_plane = hosts(netns_mesh)
    assert set(by_plane) == {"global", "edge", *netns_mesh.zone_of()}
    addresses = {h["address"] for h in by_plane.values()}
    assert len(addresses) == len(by_plane) and not any(a.startswith("127.") for a in addresses)
    assert host_of(str(netns_mesh.info["global_address"])) == by_plane["global"]["address"]
    assert urlsplit(netns_mesh.edge_url).hostname == by_plane["edge"]["address"]
    registered = asyncio.run(listed_regions(netns_mesh))
    regions = netns_mesh.info["regions"]
    assert isinstance(regions, list) and set(registered) == {r["region"] for r in regions}
    for region in regions:
        own = by_plane[region["region"]]["address"]
        # What the edge dials is the region's host address, the one it serves on.
        assert registered[region["region"]] == region["address"]
        assert host_of(region["address"]) == own
        assert all(host_of(pod["address"]) == own for pod in region["engines"])
    bridge = netns_mesh.info["netns"]["bridge"]  # type: ignore[index]
    for host in by_plane.values():
        assert f"master {bridge}" in _ip("-o", "link", "show", host["link"])
        inside = subprocess.run(
            ["ip", "-n", host["netns"], "-o", "-4", "addr", "show", "eth0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        assert f"inet {host['address']}/24" in inside


@pytest.fixture(scope="module")
def link_drill(netns_mesh: RunningMesh) -> tuple[dict[str, Any], dict[str, int]]:
    """The drill's report, and the bytes each host's link carried while it ran."""
    links = {plane: host["link"] for plane, host in hosts(netns_mesh).items()}
    before = {plane: _link_bytes(link) for plane, link in links.items()}
    report = drill(netns_mesh, "--kind", "region", "--mode", "link-down")
    print("netns drill report:", json.dumps(report, separators=(",", ":")))
    return report, {plane: _link_bytes(link) - before[plane] for plane, link in links.items()}


def test_taking_the_serving_regions_link_down_loses_no_token(
    netns_mesh: RunningMesh, link_drill: tuple[dict[str, Any], dict[str, int]]
) -> None:
    report, _ = link_drill
    assert_clean(report)
    region, host = report["region"], hosts(netns_mesh)[report["region"]]
    assert (report["kind"], report["mode"]) == ("region", "link-down") and region in {"us-east", "us-west"}
    assert report["target"] == f"{region} (host {host['address']}, link {host['link']})"
    assert report["tokens_lost"] == 0 and report["tokens_duplicated"] == 0
    assert report["streams_affected"] >= 1 and report["stall_p99_s"] is not None
    assert report["time_to_return_s"] is not None and report["usage_records_lost"] == 0
    assert report["passed"] is True
    # The link is up again, and the region serves on.
    assert "UP" in _ip("-o", "link", "show", host["link"]).partition("<")[2].partition(">")[0].split(",")


def test_every_hop_crossed_the_hosts_links(link_drill: tuple[dict[str, Any], dict[str, int]]) -> None:
    report, carried = link_drill
    # The drill's client to the edge, the edge to the regions and the global
    # plane, the regions to the global plane: each through a veth pair.
    for plane in ("edge", "global", "us-east", "us-west"):
        assert carried[plane] > 0, (plane, carried)
    assert carried["edge"] > report["tokens_received"]


async def _route(mesh: RunningMesh, zone: str) -> list[str]:
    async with mesh.channel(str(mesh.info["global_address"]), role_name(Role.GLOBAL)) as channel:
        geo = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        routed = await geo.Route(gpb.RouteRequest(tenant_id=mesh.tenant_id(zone)), timeout=10)
    return [s.report.region for s in routed.regions]


def test_a_killed_global_plane_routes_at_once_when_restarted(
    netns_mesh: RunningMesh, link_drill: tuple[dict[str, Any], dict[str, int]]
) -> None:
    mesh_file = netns_mesh.home / "mesh.json"
    killed = int(json.loads(mesh_file.read_text())["pids"]["global"])
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while int(json.loads(mesh_file.read_text())["pids"]["global"]) == killed:
        assert time.monotonic() < deadline, "llmmesh up did not restart the global plane"
        time.sleep(0.05)
    # The restarted plane serves (mesh.json names it only then) and routes from
    # the heartbeats kept in its store, before any region reports to it again.
    assert set(asyncio.run(_route(netns_mesh, "us"))) == netns_mesh.regions_in("us")


def test_taking_the_global_planes_link_down_fails_no_turn(netns_mesh: RunningMesh) -> None:
    report = drill(netns_mesh, "--kind", "global-plane", "--mode", "link-down", "--outage-s", "8")
    assert_clean(report)
    host = hosts(netns_mesh)["global"]
    assert report["target"] == f"global (host {host['address']}, link {host['link']})"
    assert report["turns_failed_clearly"] == 0 and report["tokens_lost"] == 0
    assert report["passed"] is True


def test_a_region_cut_off_from_the_global_plane_alone_keeps_serving_its_zone(netns_mesh: RunningMesh) -> None:
    # Long enough for geo-routing to call the region DOWN (three missed heartbeats) well before the end.
    report = drill(netns_mesh, "--kind", "partition-global", "--restore-after-s", "7")
    print("partition-global drill report:", json.dumps(report, separators=(",", ":")))
    assert_clean(report)
    region, hosts_of = report["region"], hosts(netns_mesh)
    assert (report["kind"], report["mode"]) == ("partition-global", "partition")
    assert region in {"us-east", "us-west"}
    assert report["target"].startswith(
        f"{region} from global (hosts {hosts_of[region]['address']} and {hosts_of['global']['address']} "
    )
    # The global plane lost the region; the edge, reaching it serving, kept sending it turns.
    assert report["time_to_exclude_s"] is not None and report["excluded_s"] is not None
    assert report["turns_on_region_while_excluded"] >= 1
    assert report["turns_failed_clearly"] == 0 and report["tokens_lost"] == 0, report["errors"]
    assert report["time_to_return_s"] is not None and report["usage_records_lost"] == 0
    assert report["passed"] is True
