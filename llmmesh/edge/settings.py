"""Settings of one edge process."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.core.config import setting
from llmmesh.core.ids import is_valid_name
from llmmesh.core.mtls import MeshTlsSettings


@dataclass(frozen=True)
class EdgeSettings(MeshTlsSettings):
    """Where the edge listens, where the global plane is, and how long
    streams stay resumable."""

    host: str = setting("127.0.0.1", "address the HTTP server listens on")
    port: int = setting(8080, "HTTP port; 0 picks a free one")
    advertise_address: str = setting(
        "", "host:port clients reach the edge at; empty: the bound host:port (a 0.0.0.0 bind needs one)"
    )
    global_address: str = setting("127.0.0.1:50051", "host:port of the global control plane")
    ready_file: str = setting("", "file to write the bound URL to once serving")
    auth_cache_ms: int = setting(5000, "milliseconds an authenticated key is trusted without asking again")
    first_event_timeout_ms: int = setting(
        30_000, "milliseconds to wait for a region to accept a turn before failing it"
    )
    max_body_bytes: int = setting(8 * 1024 * 1024, "largest request body accepted")
    header_timeout_s: float = setting(
        10.0, "seconds a connection may take to send a whole request head before it is closed"
    )
    https_cert_file: str = setting(
        "", "certificate chain (PEM) to serve HTTPS with; empty serves plain HTTP (behind a TLS proxy)"
    )
    https_key_file: str = setting("", "private key (PEM) of https_cert_file")
    redis_url: str = setting(
        "",
        "Redis of the shared stream log (resume and cancel on any edge) of the zones redis_urls does not "
        "name; empty keeps their streams in-process",
    )
    redis_urls: str = setting(
        "",
        "each zone's Redis, which alone holds its tenants' stream logs: 'eu=rediss://…,us=rediss://…' "
        "('eu=' keeps eu's streams in-process)",
    )
    stream_log_max_events: int = setting(
        4096, "most SSE events the log holds per stream; the oldest go first"
    )
    stream_log_max_streams: int = setting(1024, "most finished streams the in-process log keeps")
    stream_retention_s: float = setting(300.0, "seconds a stream stays resumable after its last event")
    stream_log_timeout_ms: int = setting(
        500,
        "longest one write to the shared stream log may take; a stream whose log write fails or takes "
        "longer streams on without resumability",
    )
    detached_timeout_ms: int = setting(
        60_000, "a resumable stream (x-llmmesh-resumable) no reader follows for this long is cancelled"
    )
    cancel_grace_ms: int = setting(
        5_000, "after a cancel, milliseconds to wait for the region's final usage before dropping the call"
    )
    stall_timeout_ms: int = setting(
        3_000, "a generating region stream silent this long (after its first token) counts as broken"
    )
    failover_deadline_ms: int = setting(
        30_000, "longest a broken stream may take to go on in another region before it ends with an error"
    )
    region_keepalive_ms: int = setting(
        1_000, "keepalive ping interval and timeout on region channels: how soon a cut link is noticed"
    )
    route_cache_ms: int = setting(
        1_000, "milliseconds a tenant's route (its zone's regions, best first) is reused without asking"
    )
    route_stale_ms: int = setting(
        30_000,
        "milliseconds an older route is still used while a fresh one is fetched behind it "
        "(a region that stopped serving meanwhile fails over as it would with a fresh route; "
        "equal to route_cache_ms: never)",
    )
    global_outage_grace_s: float = setting(
        300.0,
        "while the global plane is unreachable, keys and routes it answered this recently are still used",
    )
    location: str = setting(
        "",
        "where this edge's clients are: a region name or 'lat,lon' in degrees; geo-routing then puts the "
        "zone's nearest region first (empty: no preference)",
    )
    ops_key: str = setting(
        "", "operator key (Bearer) of the operator page's /ops/api; empty: that API refuses every request"
    )
    ops_admin_cert_file: str = setting(
        "",
        "an admin certificate of the mesh CA (PEM) the operator API manages tenants' API keys with; "
        "whoever holds ops_key can then create and revoke keys (empty: it cannot)",
    )
    ops_admin_key_file: str = setting("", "private key (PEM) of ops_admin_cert_file")

    def __post_init__(self) -> None:
        for name in (
            "stream_log_max_events",
            "stream_log_max_streams",
            "stream_retention_s",
            "stream_log_timeout_ms",
            "detached_timeout_ms",
            "cancel_grace_ms",
            "stall_timeout_ms",
            "failover_deadline_ms",
            "region_keepalive_ms",
            "route_cache_ms",
            "route_stale_ms",
            "global_outage_grace_s",
            "header_timeout_s",
        ):
            # Written so that NaN fails too.
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        _check_location(self.location)
        self.zone_redis_urls()
        if self.route_stale_ms < self.route_cache_ms:
            raise ValueError("route_stale_ms must be at least route_cache_ms")
        if bool(self.https_cert_file) != bool(self.https_key_file):
            raise ValueError("https_cert_file and https_key_file go together: set both or neither")
        if bool(self.ops_admin_cert_file) != bool(self.ops_admin_key_file):
            raise ValueError("ops_admin_cert_file and ops_admin_key_file go together: set both or neither")
        if self.ops_admin_cert_file and not self.ops_key:
            raise ValueError(
                "ops_admin_cert_file lets the operator key manage API keys: set ops_key (LLMMESH_OPS_KEY) too"
            )
        if self.ops_admin_cert_file and self.insecure:
            raise ValueError(
                "ops_admin_cert_file is an mTLS identity, and insecure (plaintext) presents none: "
                "unset one of them"
            )
        if self.probe_port:
            # Inherited with the mesh identity, but the edge serves HTTP, not gRPC.
            raise ValueError(
                f"probe_port ({self.probe_port}) is for gRPC planes: the edge serves no gRPC, so nothing "
                "would answer grpc.health.v1 there; probe the edge's HTTP port (TCP, or /healthz) "
                "and unset LLMMESH_PROBE_PORT / --probe-port"
            )

    def zone_redis_urls(self) -> dict[str, str]:
        """``redis_urls`` by zone; ValueError naming the setting when it is malformed."""
        urls: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.redis_urls.split(","))):
            zone, sep, url = (side.strip() for side in item.partition("="))
            if not sep or not is_valid_name(zone) or (url and "://" not in url):
                # Only the zone part is shown: the URL may hold a password.
                raise ValueError(
                    f"redis_urls must be 'zone=redis://…' items separated by commas; got an item "
                    f"starting {zone[:20]!r}"
                )
            if url and url.partition("://")[0] not in ("redis", "rediss", "unix"):
                raise ValueError(f"redis_urls: zone {zone}'s URL must be redis://, rediss:// or unix://")
            if zone in urls:
                raise ValueError(f"redis_urls names zone {zone} twice")
            urls[zone] = url
        return urls

    @property
    def https(self) -> bool:
        """Whether the edge serves HTTPS itself."""
        return bool(self.https_cert_file)


def _check_location(text: str) -> None:
    """ValueError naming the setting unless ``text`` is empty, a region name or 'lat,lon'."""
    if not text or is_valid_name(text):
        return
    lat, sep, lon = text.partition(",")
    try:
        point = (float(lat), float(lon)) if sep else None
    except ValueError:
        point = None
    if point is None or not (-90 <= point[0] <= 90 and -180 <= point[1] <= 180):
        raise ValueError(f"location must be a region name or 'lat,lon' in degrees, got {text!r}")
