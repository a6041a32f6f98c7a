"""Settings of one region plane process."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.config import setting
from llmmesh.home import mesh_home


@dataclass(frozen=True)
class RegionSettings:
    """Where the region listens, what it is, and whom it talks to."""

    host: str = setting("127.0.0.1", "address the ChatService listens on")
    port: int = setting(0, "port the ChatService listens on; 0 picks a free one")
    region: str = setting("us-east", "this region's name")
    zone: str = setting("us", "the zone (jurisdiction) this region belongs to")
    location: str = setting("39.0,-77.5", "'lat,lon' of the region, for proximity routing")
    global_address: str = setting("127.0.0.1:50051", "host:port of the global control plane")
    engine_addresses: str = setting("", "comma-separated host:port of this region's engine pods")
    ready_file: str = setting("", "file to write the bound address to once serving")
    heartbeat_interval_ms: int = setting(1000, "milliseconds between heartbeats to geo-routing")
    policy_refresh_ms: int = setting(2000, "milliseconds between policy snapshot refreshes")
    policy_max_staleness_ms: int = setting(
        300_000, "longest a cached policy snapshot is trusted while the global plane is unreachable"
    )
    engine_health_interval_ms: int = setting(1000, "milliseconds between engine pod health checks")
    max_messages: int = setting(2048, "most messages one turn may carry")
    max_message_chars: int = setting(1_000_000, "most characters one message may carry")
    zone_store_url: str = setting(
        "",
        "SQLAlchemy URL of the zone's conversation store; empty means sqlite:///$LLMMESH_HOME/zone-ZONE.db",
    )

    def zone_store_database_url(self) -> str:
        """The configured zone store URL, or the embedded SQLite file of the zone."""
        return self.zone_store_url or f"sqlite:///{mesh_home() / f'zone-{self.zone}.db'}"

    def engine_address_list(self) -> list[str]:
        return [a.strip() for a in self.engine_addresses.split(",") if a.strip()]
