"""Kind ``partition-global`` without a mesh: its plan and its CLI name (and
``pod``'s former one), where it can run, and the cut itself between two
real hosts of their own (root only). Its report's figures are in
test_drill_report."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmmesh.cli.drill import add_drill_arguments, plan_from_args
from llmmesh.core.mtls import MeshSecurity
from llmmesh.drill.disruption import RouteDisruption
from llmmesh.drill.plan import DrillPlan
from llmmesh.drill.setup import DrillInputError, DrillSetup
from llmmesh.drill.target import MeshTarget, TenantKey
from llmmesh.topology.netns import HostNetwork, NetHost, netns_available

ZONES = {"us-east": "us", "us-west": "us"}
PLAN = DrillPlan(kind="partition-global", mode="partition", streams=2, max_tokens=8)


def plan_of(*flags: str) -> DrillPlan:
    parser = argparse.ArgumentParser()
    add_drill_arguments(parser)
    return plan_from_args(parser.parse_args(["failover", *flags]))


def test_pod_is_the_kind_and_engine_pod_its_former_name() -> None:
    assert plan_of("--kind", "pod").kind == "pod"
    assert plan_of("--kind", "engine-pod").kind == "pod"
    assert DrillPlan(kind="engine-pod").kind == "pod" and DrillPlan(kind="pod").names_region


def test_partition_global_names_a_region_and_partitions_only() -> None:
    plan = plan_of("--kind", "partition-global", "--restore-after-s", "7")
    assert (plan.kind, plan.mode, plan.partition_s, plan.names_region) == (
        "partition-global",
        "partition",
        7,
        True,
    )
    for mode in ("kill", "link-down"):
        with pytest.raises(ValueError, match="partition-global"):
            DrillPlan(kind="partition-global", mode=mode)


def test_a_mesh_on_one_host_cannot_be_cut_from_the_global_plane(tmp_path: Path) -> None:
    mesh_file = tmp_path / "mesh.json"
    mesh_file.write_text(json.dumps({"pid": 1, "pids": {"us-east": 2, "global": 3}}))
    target = MeshTarget(
        "http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", MeshSecurity.insecure(), mesh_file=mesh_file
    )
    setup = DrillSetup(PLAN, target, (TenantKey("sk", "tenant", "us"),), ZONES)
    with pytest.raises(DrillInputError, match="llmmesh up --netns"):
        setup.disruption_for("us-east")
    # A deployed mesh is cut by the operator's command.
    deployed = DrillSetup(PLAN, target, (TenantKey("sk", "tenant", "us"),), ZONES, disrupt_command="true")
    assert deployed.disruption_for("us-east").description == "`true`"


REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=2)
except ConnectionRefusedError:
    print("reached")  # nothing listens on port 9: the packets got there and back
except OSError as err:
    print(type(err).__name__)
"""


def reach(host: NetHost, address: str) -> str:
    """What a connection from ``host`` to ``address`` finds: ``reached``, or why not."""
    found = subprocess.run(
        [*host.exec_prefix(), sys.executable, "-c", REACH, address],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip()


@pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))
def test_the_cut_drops_the_packets_between_two_hosts_only(tmp_path: Path) -> None:
    with HostNetwork() as net:
        region, glob, edge = net.add_hosts(["region", "global", "edge"])
        hosts = {h.name: {"netns": h.netns, "address": h.address, "link": h.link} for h in (region, glob)}
        mesh_file = tmp_path / "mesh.json"
        mesh_file.write_text(json.dumps({"netns": {"hosts": hosts}}))
        cut = RouteDisruption(mesh_file, "region", "global")
        assert cut.description.startswith(f"region from global (hosts {region.address} and {glob.address}")
        assert reach(region, glob.address) == "reached"
        asyncio.run(cut.disrupt())
        try:
            assert reach(region, glob.address) != "reached"
            assert reach(glob, region.address) != "reached"
            # Every other path stays.
            for source, target in ((edge, region), (edge, glob), (region, edge), (glob, edge)):
                assert reach(source, target.address) == "reached"
        finally:
            asyncio.run(cut.release())
        assert reach(region, glob.address) == "reached" and reach(glob, region.address) == "reached"
        asyncio.run(cut.release())  # nothing left to remove
