"""Separate hosts on one Linux machine: a network namespace per host.

:class:`HostNetwork` makes a bridge in the root namespace with the first
address of a private /24, and for each host a namespace joined to the
bridge by a veth pair (``eth0`` inside, with the next address of the /24;
the root end on the bridge). Hosts reach each other, and the root
namespace reaches them, only through those interfaces, so every hop of
the mesh crosses a real network interface; taking a host's root-side veth
down (:meth:`HostNetwork.link_down`) cuts it off as a pulled cable does.

Names carry a random run id (namespaces ``llmmesh-ID-HOST``, interfaces
``lmID…``) and the /24 is one no route of this machine uses yet, so runs
side by side never clash. :meth:`HostNetwork.remove` deletes all of it,
and the network is a context manager that always does. Needs root and
iproute2 (``ip``).
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from llmmesh.core.ids import is_valid_name

COMMAND_TIMEOUT_S = 10.0
"""Longest one ``ip`` command may take."""
MAX_HOSTS = 200
"""Hosts of one network: the /24 less the bridge's address and a margin."""
_SUBNET_TRIES = 64


class NetnsError(Exception):
    """The network cannot be made (no root, no iproute2, a failed ``ip`` command); the message says why."""


@dataclass(frozen=True)
class NetHost:
    """One host: its namespace, its address and the root end of its link."""

    name: str
    netns: str
    address: str
    link: str

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {err}") from err
    if check and result.returncode != 0:
        raise NetnsError(
            f"`ip {' '.join(args)}` exited with status {result.returncode}: {result.stderr.strip()}"
        )
    return result


def set_link(link: str, *, up: bool) -> None:
    """Set the interface ``link`` of the root namespace up or down."""
    _ip("link", "set", link, "up" if up else "down")


def netns_available() -> str | None:
    """None when this process can make namespaces; else why it cannot."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        try:
            used.append(ipaddress.IPv4Network(first))
        except ValueError:
            continue
    return used


def _free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(_SUBNET_TRIES):
        candidate = ipaddress.IPv4Network(f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 255)}.0/24")
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    raise NetnsError("no free 10.x.y.0/24 for the host network")


class HostNetwork:
    """A bridge and a namespace per host; see the module docstring."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or os.urandom(3).hex()
        if not (len(self.run_id) == 6 and all(c in "0123456789abcdef" for c in self.run_id)):
            raise ValueError(f"run_id must be 6 lowercase hex digits, got {self.run_id!r}")
        self.bridge = f"lm{self.run_id}br"
        self.hosts: dict[str, NetHost] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self._made_bridge = False

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge."""
        if self.subnet is None:
            raise NetnsError("the host network is not made yet")
        return str(self.subnet.network_address + 1)

    def create(self) -> None:
        """Make the bridge, on a /24 no route uses yet."""
        why = netns_available()
        if why is not None:
            raise NetnsError(why)
        self.subnet = _free_subnet(random.Random(self.run_id))
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> NetHost:
        """A new namespace linked to the bridge, with the next address of the /24."""
        if self.subnet is None:
            self.create()
        assert self.subnet is not None
        if not is_valid_name(name) or name in self.hosts:
            raise ValueError(f"host name {name!r} is invalid or taken")
        index = len(self.hosts) + 1
        if index > MAX_HOSTS:
            raise NetnsError(f"a host network holds at most {MAX_HOSTS} hosts")
        netns = f"llmmesh-{self.run_id}-{name}"
        host = NetHost(name, netns, str(self.subnet.network_address + 1 + index), f"lm{self.run_id}h{index}")
        _ip("netns", "add", netns)
        self.hosts[name] = host
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def add_hosts(self, names: Sequence[str]) -> list[NetHost]:
        return [self.add_host(name) for name in names]

    def link_down(self, host: NetHost) -> None:
        """Cut ``host`` off: its link goes down; its connections stay open, unanswered."""
        set_link(host.link, up=False)

    def link_up(self, host: NetHost) -> None:
        set_link(host.link, up=True)

    def link_is_up(self, host: NetHost) -> bool:
        flags = _ip("-o", "link", "show", host.link).stdout.partition("<")[2].partition(">")[0]
        return "UP" in flags.split(",")

    def remove(self) -> list[str]:
        """Delete every namespace (their veth pairs go with them) and the bridge.

        Goes on past failures; returns what could not be removed."""
        left = []
        for host in list(self.hosts.values()):
            if _ip("netns", "del", host.netns, check=False).returncode != 0 and _netns_exists(host.netns):
                left.append(host.netns)
            _ip("link", "del", host.link, check=False)
            del self.hosts[host.name]
        if self._made_bridge:
            if _ip("link", "del", self.bridge, check=False).returncode == 0:
                self._made_bridge = False
            else:
                left.append(self.bridge)
        return left

    def __enter__(self) -> HostNetwork:
        try:
            self.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def _netns_exists(netns: str) -> bool:
    return netns in _ip("netns", "list", check=False).stdout.split()
