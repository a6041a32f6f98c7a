"""Settings of one edge process."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.config import setting


@dataclass(frozen=True)
class EdgeSettings:
    """Where the edge listens and where the global plane is."""

    host: str = setting("127.0.0.1", "address the HTTP server listens on")
    port: int = setting(8080, "HTTP port; 0 picks a free one")
    global_address: str = setting("127.0.0.1:50051", "host:port of the global control plane")
    ready_file: str = setting("", "file to write the bound URL to once serving")
    auth_cache_ms: int = setting(5000, "milliseconds an authenticated key is trusted without asking again")
    first_event_timeout_ms: int = setting(
        30_000, "milliseconds to wait for a region to accept a turn before failing it"
    )
    max_body_bytes: int = setting(8 * 1024 * 1024, "largest request body accepted")
