"""The Envoy front proxy's configuration (Envoy v3 API), rendered from a
topology of edge instances and regions.

One listener fronts the edge instances (OpenAI HTTP + SSE); a second one
fronts the regions' ``ChatService`` for gRPC streaming clients, routed by the
``x-llmmesh-region`` (or ``x-llmmesh-zone``) request header. Every timeout is
streaming-safe: no route timeout, an idle timeout per stream, and a per-try
timeout that only guards the first byte. Retries happen only where the
request cannot have been served (connect failure, reset, refused stream,
gRPC ``UNAVAILABLE``), and a region's cluster fails over to the other regions
of its zone, never outside it.

Both listeners serve TLS, Envoy calls the regions with mutual TLS and, where
they serve HTTPS, the edge instances over TLS (:mod:`llmmesh.topology.envoy_tls`);
plaintext only when a topology says so (``tls=None``, ``--plaintext``).

``deploy/envoy/front-proxy.yaml`` is this module's output for the default
embedded topology (``python -m llmmesh.topology.envoy_config``); tests render configs
for the ports their in-process planes bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.ids import is_valid_name
from llmmesh.topology.envoy_tls import (
    DEFAULT_CERTS_DIR,
    EDGE_SERVER_NAME,
    ProxyTls,
    downstream_socket,
    edge_socket,
    region_socket,
    write_sds_files,
)
from llmmesh.topology.yaml_text import to_yaml

Doc = dict[str, Any]

REGION_HEADER = "x-llmmesh-region"
ZONE_HEADER = "x-llmmesh-zone"
CHAT_SERVICE = "llmmesh.v1.ChatService"
# Only failures where the upstream cannot have started the turn; a 5xx in
# general is an answer, not a reason to run the turn twice.
HTTP_RETRY_ON = "connect-failure,refused-stream,reset"
GRPC_RETRY_ON = "connect-failure,refused-stream,reset,unavailable"
_TYPE = "type.googleapis.com/envoy."


@dataclass(frozen=True)
class Upstream:
    """One ``host:port`` the proxy sends to."""

    host: str
    port: int

    @classmethod
    def parse(cls, address: str) -> Upstream:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(Reason.INVALID_REQUEST, f"expected host:port, got {address!r}")
        return cls(host.strip("[]"), int(port))


@dataclass(frozen=True)
class RegionUpstream:
    """A region's ``ChatService``, and the zone it belongs to."""

    region: str
    zone: str
    address: Upstream


@dataclass(frozen=True)
class FrontProxy:
    """What the proxy fronts, its certificates (``tls`` None: plaintext on
    every hop, for development), where it listens, and its streaming limits."""

    edges: tuple[Upstream, ...]
    regions: tuple[RegionUpstream, ...]
    tls: ProxyTls | None
    listen_host: str = "0.0.0.0"
    http_port: int = 10000
    grpc_port: int = 10001
    admin_port: int = 9901
    health_check_interval_s: float = 5.0
    stream_idle_timeout_s: float = 300.0
    first_byte_timeout_s: float = 30.0
    num_retries: int = 2

    def __post_init__(self) -> None:
        if not self.edges or not self.regions:
            raise InvalidArgument(Reason.INVALID_REQUEST, "a front proxy needs edges and regions")
        names = [r.region for r in self.regions]
        if len(set(names)) != len(names):
            raise InvalidArgument(Reason.INVALID_REQUEST, f"region listed twice in {names}")
        for name in (*names, *self.zones()):
            if not is_valid_name(name):
                raise InvalidArgument(Reason.INVALID_REQUEST, f"invalid region or zone name {name!r}")

    def zones(self) -> list[str]:
        """The zones, in the order their first region is listed."""
        return list(dict.fromkeys(r.zone for r in self.regions))

    def zone_regions(self, zone: str) -> list[RegionUpstream]:
        return [r for r in self.regions if r.zone == zone]


EXAMPLE_TLS = ProxyTls.in_directory()
"""The certificates of the documented layout, under ``/etc/llmmesh/certs``."""


def embedded_front_proxy(tls: ProxyTls | None = EXAMPLE_TLS) -> FrontProxy:
    """The documented example topology: two edge instances, zone ``us``
    (us-east, us-west) and zone ``eu`` (eu-west, eu-central), all on
    loopback, with the certificates of ``/etc/llmmesh/certs``."""
    regions = (
        ("us-east", "us", 50061),
        ("us-west", "us", 50062),
        ("eu-west", "eu", 50071),
        ("eu-central", "eu", 50072),
    )
    return FrontProxy(
        edges=(Upstream("127.0.0.1", 8080), Upstream("127.0.0.1", 8081)),
        regions=tuple(
            RegionUpstream(name, zone, Upstream("127.0.0.1", port)) for name, zone, port in regions
        ),
        tls=tls,
    )


def envoy_config(proxy: FrontProxy) -> Doc:
    """The bootstrap document for ``proxy``."""
    grpc_routes = [_grpc_route(REGION_HEADER, r.region, f"region-{r.region}", proxy) for r in proxy.regions]
    grpc_routes += [_grpc_route(ZONE_HEADER, zone, f"zone-{zone}", proxy) for zone in proxy.zones()]
    http_route = {"match": {"prefix": "/"}, "route": _route_action("edge", HTTP_RETRY_ON, proxy)}
    clusters = [_edge_cluster(proxy)]
    for region in proxy.regions:
        peers = [r for r in proxy.zone_regions(region.zone) if r != region]
        # The home region first; its zone's other regions only when it fails.
        clusters.append(_chat_cluster(f"region-{region.region}", region.zone, [[region], peers], proxy))
    for zone in proxy.zones():
        clusters.append(_chat_cluster(f"zone-{zone}", zone, [proxy.zone_regions(zone)], proxy))
    return {
        "node": {"id": "front-proxy", "cluster": "llmmesh-front-proxy"},
        "admin": {"address": _address("127.0.0.1", proxy.admin_port)},
        "static_resources": {
            "listeners": [
                _listener("http", proxy.http_port, [http_route], proxy, grpc=False),
                _listener("grpc", proxy.grpc_port, grpc_routes, proxy, grpc=True),
            ],
            "clusters": clusters,
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": _TYPE + "extensions.resource_monitors.downstream_connections.v3."
                        "DownstreamConnectionsConfig",
                        "max_active_downstream_connections": 50000,
                    },
                }
            ]
        },
    }


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _address(host: str, port: int) -> Doc:
    return {"socket_address": {"address": host, "port_value": port}}


def _listener(name: str, port: int, routes: list[Doc], proxy: FrontProxy, *, grpc: bool) -> Doc:
    manager: Doc = {
        "@type": _TYPE + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "codec_type": "AUTO",
        "use_remote_address": True,
        "normalize_path": True,
        "merge_slashes": True,
        # Streams live as long as tokens flow; an idle one ends after this.
        "stream_idle_timeout": _duration(proxy.stream_idle_timeout_s),
        "request_headers_timeout": "10s",
        "common_http_protocol_options": {
            "idle_timeout": "3600s",
            "headers_with_underscores_action": "REJECT_REQUEST",
        },
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPE + "extensions.filters.http.router.v3.Router"},
            }
        ],
        "access_log": [
            {
                "name": "envoy.access_loggers.stdout",
                "typed_config": {"@type": _TYPE + "extensions.access_loggers.stream.v3.StdoutAccessLog"},
            }
        ],
    }
    if grpc:
        manager["http2_protocol_options"] = {
            "max_concurrent_streams": 1000,
            "initial_stream_window_size": 65536,
            "initial_connection_window_size": 1048576,
        }
    chain: Doc = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]
    }
    if proxy.tls is not None:
        alpn = ["h2"] if grpc else ["h2", "http/1.1"]
        chain["transport_socket"] = downstream_socket(proxy.tls, alpn, verify_clients=grpc)
    return {
        "name": name,
        "address": _address(proxy.listen_host, port),
        "per_connection_buffer_limit_bytes": 1048576,
        "filter_chains": [chain],
    }


def _grpc_route(header: str, value: str, cluster: str, proxy: FrontProxy) -> Doc:
    return {
        "match": {
            "prefix": f"/{CHAT_SERVICE}/",
            "grpc": {},
            "headers": [{"name": header, "string_match": {"exact": value}}],
        },
        "route": {
            **_route_action(cluster, GRPC_RETRY_ON, proxy),
            # Honour the client's grpc-timeout (its deadline) with no cap.
            "max_stream_duration": {"grpc_timeout_header_max": "0s"},
        },
    }


def _route_action(cluster: str, retry_on: str, proxy: FrontProxy) -> Doc:
    return {
        "cluster": cluster,
        # A generation streams for as long as it takes: no overall timeout.
        "timeout": "0s",
        "retry_policy": {
            "retry_on": retry_on,
            "num_retries": proxy.num_retries,
            # Stops once the response starts, so it only guards the first byte.
            "per_try_timeout": _duration(proxy.first_byte_timeout_s),
            "retry_back_off": {"base_interval": "0.05s", "max_interval": "0.5s"},
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": _TYPE + "extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            "host_selection_retry_max_attempts": 3,
            # A retry goes to the next priority: the home region's zone peers.
            "retry_priority": {
                "name": "envoy.retry_priorities.previous_priorities",
                "typed_config": {
                    "@type": _TYPE + "extensions.retry.priority.previous_priorities.v3."
                    "PreviousPrioritiesConfig",
                    "update_frequency": 1,
                },
            },
        },
    }


def _cluster(
    name: str, hosts: Sequence[Upstream], proxy: FrontProxy, protocol: Doc, check: Doc, tls: Doc | None
) -> Doc:
    resolved = all(_is_ip(h.host) for h in hosts)
    interval = _duration(proxy.health_check_interval_s)
    # Health checks go over the cluster's transport socket, so they check its TLS too.
    secured = {"transport_socket": tls} if tls is not None else {}
    return {
        "name": name,
        "type": "STATIC" if resolved else "STRICT_DNS",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        **secured,
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPE + "extensions.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": "300s"},
                "explicit_http_config": protocol,
            }
        },
        "health_checks": [
            {
                "timeout": "1s",
                "interval": interval,
                "no_traffic_interval": interval,
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                **check,
            }
        ],
        "outlier_detection": {
            "consecutive_5xx": 5,
            "consecutive_gateway_failure": 3,
            "enforcing_consecutive_gateway_failure": 100,
            "interval": "5s",
            "base_ejection_time": "30s",
            "max_ejection_percent": 50,
        },
        # Streams are long-lived: the default of 1024 requests would cap them.
        "circuit_breakers": {
            "thresholds": [{"max_connections": 10000, "max_pending_requests": 10000, "max_requests": 10000}]
        },
    }


def _edge_cluster(proxy: FrontProxy) -> Doc:
    cluster = _cluster(
        "edge",
        proxy.edges,
        proxy,
        {"http_protocol_options": {}},
        {"http_health_check": {"path": "/healthz"}},
        edge_socket(proxy.tls) if proxy.tls is not None and proxy.tls.edge_https else None,
    )
    endpoints = [{"endpoint": {"address": _address(e.host, e.port)}} for e in proxy.edges]
    cluster["load_assignment"] = {"cluster_name": "edge", "endpoints": [{"lb_endpoints": endpoints}]}
    return cluster


def _chat_cluster(name: str, zone: str, tiers: Sequence[Sequence[RegionUpstream]], proxy: FrontProxy) -> Doc:
    """A ChatService cluster of ``zone``'s regions: one locality per region,
    ``tiers[n]`` at priority n."""
    hosts = [r.address for tier in tiers for r in tier]
    cluster = _cluster(
        name,
        hosts,
        proxy,
        {"http2_protocol_options": {"connection_keepalive": {"interval": "30s", "timeout": "5s"}}},
        {"grpc_health_check": {"service_name": CHAT_SERVICE}},
        region_socket(proxy.tls, zone) if proxy.tls is not None else None,
    )
    localities = [
        {
            "locality": {"region": region.region, "zone": region.zone},
            "priority": priority,
            "lb_endpoints": [{"endpoint": {"address": _address(region.address.host, region.address.port)}}],
        }
        for priority, tier in enumerate(tiers)
        for region in tier
    ]
    cluster["load_assignment"] = {"cluster_name": name, "endpoints": localities}
    return cluster


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


HEADER = (
    "# The llmmesh front proxy (Envoy v3 API); deploy/envoy/README.md describes it.\n"
    "# Rendered by `python -m llmmesh.topology.envoy_config`;\n"
    "# change llmmesh/topology/envoy_config.py, not this file.\n"
)


def _edge_flag(text: str) -> Upstream:
    try:
        return Upstream.parse(text)
    except InvalidArgument as err:
        raise argparse.ArgumentTypeError(err.message) from err


def _region_flag(text: str) -> RegionUpstream:
    name, _, rest = text.partition("=")
    zone, _, address = rest.partition("@")
    if not name or not zone or not address:
        raise argparse.ArgumentTypeError(f"expected REGION=ZONE@HOST:PORT, got {text!r}")
    return RegionUpstream(name, zone, _edge_flag(address))


def _tls_arguments(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS (deploy/envoy/README.md lists the files)")
    tls.add_argument(
        "--certs-dir",
        default=DEFAULT_CERTS_DIR,
        help="directory of front-proxy.pem/.key, client-front-proxy.pem/.key and ca.pem",
    )
    tls.add_argument(
        "--server-cert", default="", help="certificate for the public names (default in --certs-dir)"
    )
    tls.add_argument("--server-key", default="", help="key of --server-cert (default in --certs-dir)")
    tls.add_argument(
        "--client-ca", default="", help="require gRPC clients to present a certificate from this CA"
    )
    tls.add_argument(
        "--edge-http", action="store_true", help="the edge instances serve plain HTTP (default: HTTPS)"
    )
    tls.add_argument(
        "--edge-ca", default="", help="CA of the edges' HTTPS certificate (default: the mesh CA)"
    )
    tls.add_argument(
        "--edge-server-name", default=EDGE_SERVER_NAME, help="name the edges' HTTPS certificate answers to"
    )
    tls.add_argument(
        "--plaintext", action="store_true", help="no TLS on any hop (development only; never the default)"
    )
    tls.add_argument(
        "--write-sds",
        action="store_true",
        help="also write the SDS file beside each certificate Envoy presents (STEM.sds.yaml), "
        "through which it reloads a rotated certificate",
    )


def _tls_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ProxyTls | None:
    if args.plaintext:
        if args.client_ca or args.edge_http or args.server_cert or args.server_key:
            parser.error("--plaintext takes no certificate options")
        return None
    # Envoy reads a relative path from its own working directory, not this one's.
    tls = ProxyTls.in_directory(
        os.path.abspath(args.certs_dir),
        client_ca=args.client_ca and os.path.abspath(args.client_ca),
        edge_https=not args.edge_http,
        edge_ca=args.edge_ca and os.path.abspath(args.edge_ca),
        edge_server_name=args.edge_server_name,
    )
    if bool(args.server_cert) != bool(args.server_key):
        parser.error("--server-cert and --server-key go together")
    if args.server_cert:
        tls = dataclasses.replace(
            tls, server_cert=os.path.abspath(args.server_cert), server_key=os.path.abspath(args.server_key)
        )
    return tls


def main(argv: Sequence[str] | None = None) -> None:
    """Print the front proxy's config: the example topology, or the one given."""
    parser = argparse.ArgumentParser(prog="python -m llmmesh.topology.envoy_config", description=main.__doc__)
    parser.add_argument("--edge", action="append", default=[], type=_edge_flag, help="HOST:PORT")
    parser.add_argument(
        "--region", action="append", default=[], type=_region_flag, help="REGION=ZONE@HOST:PORT"
    )
    parser.add_argument("--listen-host", default="0.0.0.0", help="address of the HTTP and gRPC listeners")
    parser.add_argument("--http-port", type=int, default=10000, help="port of the edge (HTTP + SSE) listener")
    parser.add_argument("--grpc-port", type=int, default=10001, help="port of the ChatService listener")
    parser.add_argument("--admin-port", type=int, default=9901, help="port of the admin interface (loopback)")
    _tls_arguments(parser)
    args = parser.parse_args(argv)
    example = embedded_front_proxy()
    try:
        proxy = FrontProxy(
            edges=tuple(args.edge) or example.edges,
            regions=tuple(args.region) or example.regions,
            tls=_tls_of(args, parser),
            listen_host=args.listen_host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            admin_port=args.admin_port,
        )
    except InvalidArgument as err:
        parser.error(err.message)
    if args.write_sds:
        if proxy.tls is None:
            parser.error("--write-sds needs TLS: a --plaintext config presents no certificate")
        for path in write_sds_files(proxy.tls):
            sys.stderr.write(f"wrote {path}\n")
    sys.stdout.write(HEADER + to_yaml(envoy_config(proxy)))


if __name__ == "__main__":
    main()
