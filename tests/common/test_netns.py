"""Hosts of their own (llmmesh.topology.netns) and the drill's link-down mode, without a mesh."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llmmesh.drill.disruption import DisruptionError, LinkDisruption, mesh_host
from llmmesh.drill.plan import DrillPlan
from llmmesh.topology.netns import HostNetwork, netns_available


def test_link_down_is_a_mode_of_the_kinds_with_a_host_of_their_own() -> None:
    assert DrillPlan(kind="region", mode="link-down").partition_s == 10.0
    assert DrillPlan(kind="global-plane", mode="link-down").partition_s == 60.0
    for kind in ("engine-pod", "redis"):
        with pytest.raises(ValueError, match="link-down"):
            DrillPlan(kind=kind, mode="link-down")


def test_a_mesh_on_one_host_has_no_link_to_take_down(tmp_path: Path) -> None:
    mesh_file = tmp_path / "mesh.json"
    mesh_file.write_text(json.dumps({"pid": 1, "pids": {}}))
    with pytest.raises(DisruptionError, match="llmmesh up --netns"):
        mesh_host(mesh_file, "us-east")
    hosts = {"us-east": {"netns": "llmmesh-abcdef-us-east", "address": "10.9.9.2", "link": "lmabcdefh1"}}
    mesh_file.write_text(json.dumps({"netns": {"bridge": "lmabcdefbr", "hosts": hosts}}))
    assert mesh_host(mesh_file, "us-east").link == "lmabcdefh1"
    with pytest.raises(DisruptionError, match="no host of 'us-west'"):
        mesh_host(mesh_file, "us-west")


@pytest.mark.parametrize("run_id", ["", "ABCDEF", "abc", "abcdefg", "ab-def"])
def test_run_ids_are_six_hex_digits(run_id: str) -> None:
    with pytest.raises(ValueError, match="run_id"):
        HostNetwork(run_id or "x")


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))
def test_hosts_reach_each_other_through_their_links_until_one_goes_down(tmp_path: Path) -> None:
    with HostNetwork() as net:
        alpha, beta = net.add_hosts(["alpha", "beta"])
        with socket.create_server((net.gateway, 0)) as server:
            port = server.getsockname()[1]
            dial = f"import socket; socket.create_connection(('{net.gateway}', {port}), timeout=2)"
            reached = subprocess.run([*beta.exec_prefix(), sys.executable, "-c", dial], check=False)
            assert reached.returncode == 0
            mesh_file = tmp_path / "mesh.json"
            entry = {"netns": beta.netns, "address": beta.address, "link": beta.link}
            mesh_file.write_text(json.dumps({"netns": {"hosts": {"beta": entry}}}))
            cut = LinkDisruption(mesh_file, "beta")
            asyncio.run(cut.disrupt())
            assert not net.link_is_up(beta)
            cut_off = subprocess.run([*beta.exec_prefix(), sys.executable, "-c", dial], check=False)
            assert cut_off.returncode != 0
            asyncio.run(cut.release())
            assert net.link_is_up(beta) and net.link_is_up(alpha)
        assert all(f" {name}" in _links() for name in (alpha.link, beta.link, net.bridge))
    # Removed on exit: namespaces, their veth pairs and the bridge.
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert alpha.netns not in listed and beta.netns not in listed
    assert all(f" {name}" not in _links() for name in (alpha.link, beta.link, net.bridge))


@pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))
def test_a_failure_while_making_the_network_leaves_nothing_behind() -> None:
    net = HostNetwork()

    def make_two_hosts_of_one_name() -> None:
        with net:
            net.add_host("alpha")
            net.add_host("alpha")

    with pytest.raises(ValueError, match="invalid or taken"):
        make_two_hosts_of_one_name()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"llmmesh-{net.run_id}-" not in listed and f" {net.bridge}" not in _links()
