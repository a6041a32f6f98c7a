"""``llmmesh up``: a whole mesh on this machine, every plane its own process,
from a TOML topology (:mod:`llmmesh.topology.mesh_config`; ``--config FILE``, else the
built-in zones ``us`` and ``eu`` of two regions each).

Start order: the global plane (and a development tenant per zone), the
engine pods, the regions (every region of a zone on the zone's store), the
edge. ``$LLMMESH_HOME/mesh.json`` (default ``~/.llmmesh``) is written once
geo-routing lists every region as serving, and removed on exit. It holds:

- ``edge_url``, ``global_address``, ``api_key`` (the dev key of the dev
  tenant's zone), ``engine_backend`` and ``regions``, a list of
  ``{region, zone, address, metrics_url, engines: [{pod_id, backend, address,
  metrics_url}]}`` whose first entry is the first region of that zone: what
  single-region readers (``llmmesh chat``, ``llmmesh admin``) use;
- ``tls``: ``{insecure: true}`` for a plaintext mesh (``--insecure``),
  else ``{insecure: false, certs_dir, ca}``: the planes' certificates, and
  the ``admin`` and ``client`` ones that ``llmmesh admin``, ``chat`` and the
  drills present (created on first start by :func:`~llmmesh.cli.certs.ensure_mesh_certs`);
- ``zone`` (the dev tenant's), ``zones`` ``{zone: {store_url, regions:
  {region: {chat_address, pods}}}}``, ``tenants`` ``{zone: {name, id}}``
  and ``keys`` ``{zone: secret}`` of the dev tenants, and ``pids`` ``{plane: pid}``
  (``global``, ``edge``, each region and pod by name);
- ``metrics`` ``{plane: url}``: the Prometheus ``/metrics`` URL of every
  plane, named as in ``pids`` (what a scrape configuration lists);
- ``ops_key``: the key of the edge's operator page and API (``/ops``), made
  for this mesh when ``LLMMESH_OPS_KEY`` names none (an operator's own key
  is passed on to the edge, never written down).

Redis (``--redis``, :func:`~llmmesh.cli.embedded_redis.choose_redis`): one
per zone, since a zone's Redis holds its tenants' stream logs (reply text).
By default a zone's configured ``redis_url``, else a ``redis-server`` child
of its own that the zone's regions share (so a key's RPM and TPM hold across
every region of its zone), and that the edge writes the zone's tenants'
stream logs to, and to no other Redis (``LLMMESH_REDIS_URLS``). Then
``mesh.json`` also holds ``redis_urls`` ``{zone: url}`` and ``pids.redis-<zone>``,
and ``redis_url`` and ``pids.redis`` name the dev zone's (or the first embedded
one), for readers of one Redis. With no ``redis-server`` on the PATH, or
``--redis none``, every region counts limits on its own, and a warning says so.

A plane that exits on its own is reported and restarted with the same
command line, environment and ports (:class:`~llmmesh.cli.supervisor.RestartPolicy`:
0.5 s, then doubling up to 10 s, given up after 10 restarts in a row), and
``mesh.json`` is rewritten (atomically) with its new pid. That holds for
every plane: a region or pod comes back on its address; the global plane
comes back on its store (tenants, keys and usage persist; regions report in
again within a heartbeat); the edge comes back on its port (streams in
flight on it end: its stream log lives in it, unless Redis holds it); an
embedded Redis comes back empty. A stopped process (SIGSTOP) has not exited
and is left alone. With ``--restart never`` a plane that exits stays down:
the mesh goes on without it (a zone's other regions serve its tenants)
unless it was the edge. Ctrl-C or SIGTERM stops every plane, the edge first
and the global plane (then Redis) last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from llmmesh.cli.arg_types import positive_number
from llmmesh.cli.embedded_redis import REDIS_MODES, choose_redis, start_embedded_redis
from llmmesh.cli.fleet_bootstrap import ensure_family_models, pod_env
from llmmesh.cli.mesh_bootstrap import dev_tenants, ensure_dev_tenants, wait_regions_serving
from llmmesh.cli.served_model import ServedModel, served_model
from llmmesh.cli.supervisor import MeshStartError, Plane, RestartPolicy, Supervisor
from llmmesh.cli.up_preflight import HomeLock, PreflightError, check_ports_free
from llmmesh.core.addresses import AddressError, check_advertisable, is_wildcard
from llmmesh.core.certs import CertFiles, move_ca_key
from llmmesh.core.home import mesh_home
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity, holder_security
from llmmesh.core.tracing import placement_env
from llmmesh.topology.mesh_certs import ca_dir, certs_dir, ensure_mesh_certs
from llmmesh.topology.mesh_config import (
    BACKENDS,
    MeshConfig,
    MeshConfigError,
    RegionConfig,
    default_mesh_config,
    load_mesh_config,
)
from llmmesh.topology.netns import HostNetwork, NetHost, NetnsError

STARTUP_TIMEOUT_S = 120.0
"""How long a plane, or a group of planes started together, may take to
become ready, by default, in a mesh whose pods are all simulators."""
VLLM_STARTUP_TIMEOUT_S = 600.0
"""The same where a pod runs vLLM: importing it, loading the model and
sizing the KV cache take a minute on an idle machine here, several on a
busy one, and longer for a large model."""


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML topology to run (deploy/examples/); default: zones us (us-east, us-west) and "
        "eu (eu-west, eu-central), one pod per region, SQLite per zone",
    )
    parser.add_argument(
        "--engine",
        choices=BACKENDS,
        default=None,
        help="engine backend of pods whose region names none (default: the config's, else sim); "
        "vllm serves llmmesh-tiny, built on first use, and without --config runs one region per zone",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="with --engine vllm: a local Hugging Face chat model directory the vLLM pods serve "
        "(instead of llmmesh-tiny), registered as every tier's default model",
    )
    parser.add_argument(
        "--model-name",
        default="",
        help="name the --model-path model is served and registered under (default: the directory's name)",
    )
    parser.add_argument(
        "--edge-port",
        type=int,
        default=None,
        help="HTTP port of the edge (default: the config's, 8080); 0 picks one",
    )
    parser.add_argument(
        "--dev-key",
        default="sk-llmmesh-dev",
        help="API key of the dev tenant; the dev tenant of every other zone gets KEY-<zone>",
    )
    parser.add_argument(
        "--host", default=None, help="address every plane binds (default: the config's, 127.0.0.1)"
    )
    parser.add_argument(
        "--zone", default=None, help="zone of the dev tenant 'dev' (default: the config's first zone, us)"
    )
    parser.add_argument(
        "--restart",
        choices=("on-failure", "never"),
        default="on-failure",
        help="restart a plane that exits on its own, on the same ports (default), or leave it down",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="run every plane plaintext, with no certificates and no per-RPC authorization "
        "(development only); by default the planes talk mTLS with certificates from "
        "$LLMMESH_HOME/certs, created on first start",
    )
    parser.add_argument(
        "--advertise-host",
        default="",
        help="host name or address the planes advertise (with the ports they bind) for other machines "
        "to dial; needed with a --host of 0.0.0.0 or ::, which no other machine can dial",
    )
    parser.add_argument(
        "--netns",
        action="store_true",
        help="run the global plane, the edge and each region with its pods on a host of its own: a Linux "
        "network namespace linked to a bridge by a veth pair, with its own address (needs root and "
        "iproute2; removed on exit); mesh.json's netns entry names each host's namespace and link",
    )
    parser.add_argument(
        "--startup-timeout",
        type=positive_number("number of seconds"),
        default=None,
        metavar="SECONDS",
        help=f"how long a plane, or a group of planes started together, may take to become ready "
        f"(default {STARTUP_TIMEOUT_S:.0f}, {VLLM_STARTUP_TIMEOUT_S:.0f} where a pod runs vLLM)",
    )
    parser.add_argument(
        "--redis",
        choices=REDIS_MODES,
        default="auto",
        help="what each zone's regions and the edge (for the zone's tenants) share rate limits, the "
        "prefix index and stream logs in: auto (default) the zone's configured redis_url, else a "
        "redis-server of the zone's own when one is on the PATH; embedded: always one of the mesh's "
        "own per zone; none: each process alone, so RPM/TPM hold per region, not per key",
    )


def startup_timeout_s(args: argparse.Namespace, config: MeshConfig) -> float:
    """``--startup-timeout``, or the default for the mesh's pods."""
    if args.startup_timeout is not None:
        return float(args.startup_timeout)
    if any(config.backend_of(region) == "vllm" for region in config.regions()):
        return VLLM_STARTUP_TIMEOUT_S
    return STARTUP_TIMEOUT_S


def mesh_config_of(args: argparse.Namespace) -> tuple[MeshConfig, str]:
    """The configuration to run, command-line values over it, and the dev tenant's zone."""
    if args.config is not None:
        config = load_mesh_config(args.config).with_overrides(backend=args.engine)
    else:
        config = default_mesh_config(args.engine or "sim")
    config = config.with_overrides(edge_port=args.edge_port, host=args.host)
    advertise, netns = getattr(args, "advertise_host", ""), getattr(args, "netns", False)
    if netns and advertise:
        raise MeshConfigError("--netns gives every plane an address of its own: drop --advertise-host")
    if not netns and is_wildcard(config.host) and not advertise:
        raise MeshConfigError(
            f"--host {config.host!r} binds every interface, which names no address to dial: "
            "give the host other machines reach this one at with --advertise-host HOST"
        )
    try:
        check_advertisable(config.host, advertise, "--advertise-host")
    except AddressError as err:
        raise MeshConfigError(str(err)) from None
    zone = config.zone(args.zone).name if args.zone else config.zones[0].name
    return config, zone


def served_model_of(args: argparse.Namespace, config: MeshConfig) -> ServedModel | None:
    """The ``--model-path`` model, checked; None without one."""
    path, name = getattr(args, "model_path", None), getattr(args, "model_name", "")
    if path is None:
        if name:
            raise MeshConfigError("--model-name names the --model-path model: give --model-path too")
        return None
    if not any(config.backend_of(region) == "vllm" for region in config.regions()):
        raise MeshConfigError("--model-path is served by vLLM pods: add --engine vllm")
    return served_model(path, name)


@dataclass(frozen=True)
class Hosting:
    """Where the planes run and how they are reached: each on a host of
    its own (``network``, ``llmmesh up --netns``) or all on this one, the
    host name others dial (``advertise_host``; empty: the bound one)."""

    network: HostNetwork | None = None
    advertise_host: str = ""


class MeshLauncher:
    """Starts the planes of one configuration in order, printing progress."""

    def __init__(
        self,
        sup: Supervisor,
        config: MeshConfig,
        primary_zone: str,
        dev_key: str,
        embedded_redis: Sequence[str],
        *,
        insecure: bool = False,
        hosting: Hosting = Hosting(),
        served_model: ServedModel | None = None,
    ) -> None:
        self.sup = sup
        self.served_model = served_model
        self.network = hosting.network
        self.advertise_host = hosting.advertise_host
        self.hosts: dict[str, NetHost] = {}
        self.config = config
        # Zones that get a redis-server of the mesh's own, the dev zone's first.
        self.embedded_redis = sorted(embedded_redis, key=lambda zone: zone != primary_zone)
        self.redis: dict[str, Plane] = {}
        # Each zone's Redis, configured or embedded; a zone with none is not named.
        self.redis_urls = {z.name: config.redis_url_of(z) for z in config.zones if config.redis_url_of(z)}
        self.primary_zone = primary_zone
        self.tenants = dev_tenants([z.name for z in config.zones], primary_zone, dev_key)
        self.dev_key = dev_key
        # The operator page's key: the environment's, else one made for this mesh.
        given = os.environ.get("LLMMESH_OPS_KEY", "")
        self.ops_key_made = not given
        self.ops_key = given or f"ops-{secrets.token_urlsafe(24)}"
        self.tenant_ids: dict[str, str] = {}
        self.began = time.monotonic()
        self.global_plane: Plane | None = None
        self.pods: dict[str, Plane] = {}
        self.regions: dict[str, Plane] = {}
        self.edge: Plane | None = None
        self.insecure = insecure
        self.certs: dict[str, CertFiles] = {}

    def _identities(self) -> list[PlaneIdentity]:
        """Every certificate holder of the mesh: its planes, an operator and a gRPC client."""
        held = [PlaneIdentity(r, r.value) for r in (Role.GLOBAL, Role.EDGE, Role.ADMIN, Role.CLIENT)]
        for region in self.config.regions():
            held.append(PlaneIdentity(Role.REGION, region.name, region.zone, region.name))
            held += [PlaneIdentity(Role.ENGINE, pod, region.zone, region.name) for pod in region.pod_ids()]
        return held

    def _tls_flags(self, stem: str) -> list[str]:
        """The flags that give a plane its certificate (or make it plaintext)."""
        if self.insecure:
            return ["--insecure"]
        files = self.certs[stem]
        return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]

    def admin_security(self) -> MeshSecurity:
        return holder_security("admin", insecure=self.insecure, directory=certs_dir())

    def progress(self, text: str) -> None:
        print(f"llmmesh up: [{time.monotonic() - self.began:5.1f} s] {text}", file=sys.stderr, flush=True)

    def _host(self, plane: str) -> tuple[str, list[str]]:
        """Where ``plane`` (``global``, ``edge`` or a region) binds, and the prefix that runs it there."""
        if self.network is None:
            return self.config.host, []
        host = self.hosts[plane]
        return host.address, host.exec_prefix()

    def _bind(self, plane: str, port: int | str) -> tuple[list[str], list[str]]:
        """The flags that bind ``plane`` (and say what it advertises), and its command prefix."""
        host, prefix = self._host(plane)
        flags = ["--host", host, "--port", str(port)]
        if self.advertise_host and self.network is None:
            flags += ["--advertise-address", self.advertise_host]
        return flags, prefix

    def _make_hosts(self) -> None:
        """A host of its own for the global plane, the edge and each region (with its pods)."""
        if self.network is None:
            return
        named = {"global": "mesh-global", "edge": "mesh-edge"}
        named |= {r.name: r.name for r in self.config.regions()}
        for plane, name in named.items():
            self.hosts[plane] = self.network.add_host(name)
        self.progress(f"{len(self.hosts)} hosts (network namespaces) on {self.network.subnet}")

    def start(self) -> None:
        config = self.config
        self._make_hosts()
        self.start_redis()
        if not self.insecure:
            if move_ca_key(certs_dir(), ca_dir()):
                self.progress(f"moved the CA key out of {certs_dir()} into {ca_dir()}")
            self.certs = ensure_mesh_certs(certs_dir(), self._identities())
            self.progress(f"mesh certificates in {certs_dir()} ({len(self.certs)} holders)")
        self.progress("starting the global plane")
        flags, prefix = self._bind("global", config.global_port)
        flags += ["--dev-key", self.dev_key]
        flags += self._tls_flags("global")
        flags += ["--dev-zone", self.primary_zone, "--metrics-port", "0"]
        flags += ["--zones", ",".join(zone.name for zone in config.zones)]
        env = {"LLMMESH_DATABASE_URL": config.global_store_url} if config.global_store_url else {}
        if self.served_model is not None:
            env |= self.served_model.global_env()
        glob = self.global_plane = self.sup.start("global plane", "global", *flags, env=env, prefix=prefix)
        self.progress(f"global plane serving on {glob.address()}")
        if self.tenants:
            self.tenant_ids = asyncio.run(
                ensure_dev_tenants(glob.address(), self.tenants, self.admin_security())
            )
            self.progress("dev tenants: " + ", ".join(f"{t.name} (zone {t.zone})" for t in self.tenants))
        fleet = {model for region in config.regions() for model, _ in region.models}
        if fleet:
            unknown = asyncio.run(ensure_family_models(glob.address(), fleet, self.admin_security()))
            self.progress(f"models deployed: {', '.join(sorted(fleet))}")
            if unknown:
                self.progress(f"not in the registry (`llmmesh admin model register`): {', '.join(unknown)}")
        self._start_pods()
        self._start_regions()
        self.progress("starting the edge")
        flags, prefix = self._bind("edge", config.edge_port)
        flags += ["--global-address", glob.address()]
        flags += self._tls_flags("edge")
        env = {**self._edge_redis_env(), "LLMMESH_OPS_KEY": self.ops_key}
        if not self.insecure:
            # The operator page manages API keys with the operator's admin certificate.
            admin = self.certs["admin"]
            env |= {
                "LLMMESH_OPS_ADMIN_CERT_FILE": str(admin.cert),
                "LLMMESH_OPS_ADMIN_KEY_FILE": str(admin.key),
            }
        self.edge = self.sup.start("edge", "edge", *flags, env=env, prefix=prefix)
        self.progress(f"edge serving on {self.edge.info['url']}")
        names = [r.name for r in config.regions()]
        asyncio.run(
            wait_regions_serving(
                glob.address(), names, self.sup.startup_timeout_s, self._check, self.admin_security()
            )
        )
        self.progress(f"geo-routing lists all {len(names)} regions as serving")
        if not _wait_healthy(str(self.edge.info["url"]), 15.0):
            raise MeshStartError("the edge's /healthz does not answer 200")

    def start_redis(self) -> None:
        """Start the mesh's own redis-server of each zone that gets one."""
        for zone in self.embedded_redis:
            self.progress(f"starting redis-server of zone {zone}")
            # On separate hosts it runs in the root namespace, which every host reaches by the bridge.
            net = self.network
            host = net.gateway if net is not None else self.config.host
            plane, self.redis_urls[zone] = start_embedded_redis(
                self.sup, host, self.sup.run_dir, name=f"redis-{zone}", private_network=net is not None
            )
            self.redis[zone] = plane
            self.progress(f"redis-server of zone {zone} serving on {plane.address()}")

    def _check(self) -> None:
        if self.sup.stopping:
            raise MeshStartError("interrupted")
        for plane in self.sup.newly_exited():
            raise MeshStartError(f"{plane.name} exited with status {plane.process.returncode} during startup")

    def _start_pods(self) -> None:
        pods = [(region, pod) for region in self.config.regions() for pod in region.pod_models()]
        self.progress(f"starting {len(pods)} engine pods")
        for region, (pod_id, model) in pods:
            backend = self.config.backend_of(region)
            flags, prefix = self._bind(region.name, 0)
            flags += ["--metrics-port", "0"]
            flags += ["--backend", backend, "--pod-id", pod_id, *self._tls_flags(f"engine-{pod_id}")]
            env = pod_env(backend, model)
            if backend == "vllm" and not model and self.served_model is not None:
                env = self.served_model.pod_env()
            env = {**env, **placement_env(region.zone, region.name)}
            plane = self.pods[pod_id] = self.sup.launch(
                f"engine pod {pod_id}", "engine", *flags, prefix=prefix, env=env
            )
            # vLLM pods start one at a time: each takes both cores for a while,
            # and the first builds the model the others load.
            if backend == "vllm":
                self.sup.wait_ready([plane])
        self.sup.wait_ready(list(self.pods.values()))
        self.progress(f"{len(pods)} engine pods serving")

    def _start_regions(self) -> None:
        # The first region of a zone creates its store's tables: the others start after it.
        waves: list[list[RegionConfig]] = []
        for zone in self.config.zones:
            for index, region in enumerate(zone.regions):
                if index == len(waves):
                    waves.append([])
                waves[index].append(region)
        for wave in waves:
            self.progress("starting region " + ", ".join(r.name for r in wave))
            planes = [self._launch_region(region) for region in wave]
            self.sup.wait_ready(planes)
        self.progress(f"{len(self.regions)} regions serving")

    def _launch_region(self, region: RegionConfig) -> Plane:
        assert self.global_plane is not None
        store = self.config.zone(region.zone).store_database_url(mesh_home())
        engines = ",".join(self.pods[pod_id].address() for pod_id in region.pod_ids())
        flags, prefix = self._bind(region.name, region.port)
        flags += ["--region", region.name]
        flags += ["--zone", region.zone, "--global-address", self.global_plane.address()]
        flags += ["--engine-addresses", engines, *self._tls_flags(f"region-{region.name}")]
        flags += ["--metrics-port", "0"]
        if region.location:
            flags += ["--location", region.location]
        env = {"LLMMESH_ZONE_STORE_URL": store, **self._redis_env(region.zone)}
        env |= placement_env(region.zone, region.name)
        plane = self.regions[region.name] = self.sup.launch(
            f"region {region.name}", "region", *flags, env=env, prefix=prefix
        )
        return plane

    def _redis_env(self, zone: str) -> dict[str, str]:
        """A region's: its zone's Redis."""
        # URLs go by environment, not flags: they may hold a password, and flags show in `ps`.
        url = self.redis_urls.get(zone, "")
        return {"LLMMESH_REDIS_URL": url} if url else {}

    def _edge_redis_env(self) -> dict[str, str]:
        """The edge's: each zone's Redis, for that zone's tenants' stream logs alone."""
        urls = ",".join(f"{zone}={url}" for zone, url in self.redis_urls.items())
        return {"LLMMESH_REDIS_URLS": urls} if urls else {}

    def mesh_file(self) -> dict[str, object]:
        """What ``mesh.json`` says; see the module docstring."""
        assert self.global_plane is not None and self.edge is not None
        config = self.config
        ordered = sorted(config.regions(), key=lambda r: r.zone != self.primary_zone)
        keys = {t.zone: t.key for t in self.tenants}
        # A plane being restarted keeps its last ready pid until the new process serves.
        pids = {"global": self.global_plane.ready_pid, "edge": self.edge.ready_pid}
        pids |= {name: p.ready_pid for name, p in self.regions.items()} | {
            name: p.ready_pid for name, p in self.pods.items()
        }
        extra: dict[str, object] = {}
        if self.redis:
            pids |= {plane.name: plane.ready_pid for plane in self.redis.values()}
            first = self.embedded_redis[0]
            pids["redis"] = self.redis[first].ready_pid
            extra["redis_url"] = self.redis_urls[first]
            extra["redis_urls"] = {zone: self.redis_urls[zone] for zone in self.redis}
        if self.network is not None:
            extra["netns"] = self._netns_entry()
        if self.ops_key_made:
            extra["ops_key"] = self.ops_key
        return {
            "pid": os.getpid(),
            "edge_url": self.edge.info["url"],
            "api_key": keys.get(self.primary_zone, ""),
            "global_address": self.global_plane.address(),
            "engine_backend": config.backend,
            "zone": self.primary_zone,
            "regions": [self._region_entry(region) for region in ordered],
            "zones": {
                zone.name: {
                    "store_url": _shown_url(zone.store_database_url(mesh_home())),
                    "regions": {
                        r.name: {"chat_address": self.regions[r.name].address(), "pods": r.pod_ids()}
                        for r in zone.regions
                    },
                }
                for zone in config.zones
            },
            "tenants": {t.zone: {"name": t.name, "id": self.tenant_ids[t.zone]} for t in self.tenants},
            "keys": keys,
            "pids": pids,
            "tls": self._tls_entry(),
            "metrics": self._metrics_entry(),
            **extra,
        }

    def _netns_entry(self) -> dict[str, object]:
        """The hosts: by plane (``global``, ``edge``, each region), its namespace, address and link."""
        assert self.network is not None
        hosts = {
            plane: {"netns": h.netns, "address": h.address, "link": h.link} for plane, h in self.hosts.items()
        }
        return {"bridge": self.network.bridge, "subnet": str(self.network.subnet), "hosts": hosts}

    def _tls_entry(self) -> dict[str, object]:
        """How tools reach the planes: plaintext, or mTLS with the admin and client certificates."""
        if self.insecure:
            return {"insecure": True}
        return {"insecure": False, "certs_dir": str(certs_dir()), "ca": str(self.certs["admin"].ca)}

    def _metrics_entry(self) -> dict[str, str]:
        """The /metrics URL of every plane, by plane name."""
        assert self.global_plane is not None and self.edge is not None
        urls = {"global": str(self.global_plane.info["metrics_url"])}
        urls["edge"] = f"{self.edge.info['url']}/metrics"
        urls |= {name: str(plane.info["metrics_url"]) for name, plane in self.regions.items()}
        return urls | {name: str(pod.info["metrics_url"]) for name, pod in self.pods.items()}

    def _region_entry(self, region: RegionConfig) -> dict[str, object]:
        engines = [
            {
                "pod_id": pod_id,
                "backend": self.config.backend_of(region),
                "address": self.pods[pod_id].address(),
                "metrics_url": self.pods[pod_id].info["metrics_url"],
            }
            for pod_id in region.pod_ids()
        ]
        plane = self.regions[region.name]
        return {
            "region": region.name,
            "zone": region.zone,
            "address": plane.address(),
            "metrics_url": plane.info["metrics_url"],
            "engines": engines,
        }


def _shown_url(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


def _wait_healthy(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


def run_up(args: argparse.Namespace) -> int:
    """Run the mesh until Ctrl-C or SIGTERM; nothing is left running after.
    Exit status 2 for a configuration that cannot run, 1 when the mesh fails."""
    try:
        config, zone = mesh_config_of(args)
        model = served_model_of(args, config)
    except MeshConfigError as err:
        print(f"llmmesh up: {err}", file=sys.stderr)
        return 2
    home = mesh_home()
    home.mkdir(parents=True, exist_ok=True)
    mesh_file = home / "mesh.json"
    lock = HomeLock(home)
    try:
        lock.acquire()
        if not getattr(args, "netns", False):  # on its own hosts, every plane has its ports to itself
            check_ports_free(config)
    except PreflightError as err:
        lock.release()
        print(f"llmmesh up: {err}", file=sys.stderr)
        return 2
    try:
        return _run(args, config, zone, mesh_file, model)
    finally:
        lock.release()


def _run(
    args: argparse.Namespace, config: MeshConfig, zone: str, mesh_file: Path, model: ServedModel | None
) -> int:
    """:func:`run_up` once the home is this mesh's and its ports are free."""
    with tempfile.TemporaryDirectory(prefix="llmmesh-up-") as run_dir:
        policy = RestartPolicy(enabled=args.restart == "on-failure")
        sup = Supervisor(Path(run_dir), startup_timeout_s(args, config), policy)

        def on_signal(signum: int, frame: types.FrameType | None) -> None:
            sup.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        config, redis = choose_redis(args.redis, config)
        if redis.warning:
            print(f"llmmesh up: warning: {redis.warning}", file=sys.stderr, flush=True)
        network = HostNetwork() if getattr(args, "netns", False) else None
        launcher = MeshLauncher(
            sup,
            config,
            zone,
            args.dev_key,
            embedded_redis=redis.embedded_zones,
            insecure=args.insecure,
            hosting=Hosting(network, getattr(args, "advertise_host", "")),
            served_model=model,
        )
        status = 0
        try:
            if network is not None:
                network.create()
            launcher.start()
            mesh = launcher.mesh_file()
            write_mesh_file(mesh_file, mesh)
            _print_summary(launcher, mesh, mesh_file)
            status = _supervise(sup, lambda plane: write_mesh_file(mesh_file, launcher.mesh_file()))
        except (MeshStartError, NetnsError) as err:
            if not sup.stopping:
                print(f"llmmesh up: {err}", file=sys.stderr)
                status = 1
        finally:
            print("llmmesh up: stopping", file=sys.stderr, flush=True)
            sup.stop_all()
            _remove_if_ours(mesh_file)
            left = network.remove() if network is not None else []
            if left:
                print(f"llmmesh up: could not remove {', '.join(left)}", file=sys.stderr, flush=True)
    return status


def _supervise(sup: Supervisor, on_restarted: Callable[[Plane], None]) -> int:
    """Report planes that exit and restart them (:meth:`Supervisor.tend`) until
    a stop is asked for (0) or the edge is given up on (1)."""
    while not sup.stopping:
        for plane in sup.tend(on_restarted):
            if plane.kind == "edge":
                print("llmmesh up: the edge is down; stopping", file=sys.stderr, flush=True)
                return 1
        time.sleep(0.1)
    return 0


def write_mesh_file(path: Path, mesh: dict[str, object]) -> None:
    """Write ``mesh.json`` atomically: a reader sees the old file or the new, never half of one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(mesh, indent=2) + "\n")
    tmp.replace(path)


def _remove_if_ours(mesh_file: Path) -> None:
    try:
        if json.loads(mesh_file.read_text()).get("pid") == os.getpid():
            mesh_file.unlink()
    except (OSError, ValueError):
        pass


def _print_summary(launcher: MeshLauncher, mesh: dict[str, Any], mesh_file: Path) -> None:
    lines = ["llmmesh is up", f"  global plane   {mesh['global_address']}"]
    lines.append(f"  global metrics {mesh['metrics']['global']}")
    zones: dict[str, Any] = mesh["zones"]
    for region in mesh["regions"]:
        lines.append(f"  region         {region['region']} (zone {region['zone']})  {region['address']}")
        lines.append(f"  region metrics {region['metrics_url']}")
        for pod in region["engines"]:
            lines.append(f"  engine pod     {pod['pod_id']} ({pod['backend']})  {pod['address']}")
            lines.append(f"  pod metrics    {pod['metrics_url']}")
    for zone, detail in zones.items():
        lines.append(f"  zone store     {zone}  {detail['store_url']}")
    for zone in zones:
        if zone in mesh.get("redis_urls", {}):
            lines.append(f"  redis          {mesh['redis_urls'][zone]}  (embedded, zone {zone})")
        elif zone not in launcher.redis_urls:
            lines.append(f"  redis          none: rate limits count per region, not per key (zone {zone})")
    lines += [
        f"  edge           {mesh['edge_url']}",
        f"  OpenAI base    {mesh['edge_url']}/v1",
        f"  web chat       {mesh['edge_url']}/chat",
        f"  operator page  {mesh['edge_url']}/ops  "
        + (
            f"(operator key {launcher.ops_key}, made for this mesh; LLMMESH_OPS_KEY sets one)"
            if launcher.ops_key_made
            else "(operator key from LLMMESH_OPS_KEY)"
        ),
    ]
    for tenant in launcher.tenants:
        lines.append(f"  dev API key    {tenant.key}  (tenant {tenant.name}, zone {tenant.zone})")
    lines += [
        f"  written to     {mesh_file}",
        f"  started in     {time.monotonic() - launcher.began:.1f} s",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)
