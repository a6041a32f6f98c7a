"""Settings of one region plane process."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.core.config import setting
from llmmesh.core.home import mesh_home
from llmmesh.core.mtls import MeshTlsSettings
from llmmesh.region.knowledge.retrieval_settings import RetrievalSettings
from llmmesh.region.safety.config import SafetySettings


@dataclass(frozen=True)
class RegionSettings(SafetySettings, MeshTlsSettings, RetrievalSettings):
    """Where the region listens, what it is, and whom it talks to."""

    host: str = setting("127.0.0.1", "address the ChatService listens on")
    port: int = setting(0, "port the ChatService listens on; 0 picks a free one")
    advertise_address: str = setting(
        "", "host:port the region registers for the edge to dial; empty: the bound one (0.0.0.0 needs one)"
    )
    metrics_port: int = setting(
        0, "port of the HTTP /metrics endpoint (llmmesh_region_* series) on host; 0 picks one, -1 serves none"
    )
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
    pod_stall_ms: int = setting(
        15_000,
        "a pod that sends a turn nothing for this many ms after its first token has stalled: another "
        "pod of the model goes on with the turn; 0 never gives up on a pod. Under the edge's "
        "--stall-timeout-ms (3 s), which crosses regions",
    )
    pod_slow_start_ms: int = setting(
        10_000,
        "a pod back from an outage is given a share of its batch growing linearly from 10% to all of it "
        "over this many ms (a cold KV cache would otherwise draw every turn at once); 0 off",
    )
    max_messages: int = setting(2048, "most messages one turn may carry")
    max_message_chars: int = setting(1_000_000, "most characters one message may carry")
    routing_policy: str = setting(
        "precise", "how turns are placed on pods: precise, approximate, round_robin or least_loaded"
    )
    hedge_ttft_ms: int = setting(
        0, "premium turns without a first token after this many ms start on a second pod too; 0 off"
    )
    hedge_max_priority: int = setting(
        0, "hedging covers engine priorities up to this (0 enterprise, 1 pro, 2 free)"
    )
    fallback_queue_factor: float = setting(
        2.0, "a model is overloaded when every pod of it is this many batches deep; turns then may fall back"
    )
    named_fallback_tiers: str = setting(
        "", "comma-separated tenant tiers whose turns on a named model may fall back too (auto always may)"
    )
    redis_url: str = setting(
        "",
        "Redis URL shared by every region of the zone and their replicas: a key's RPM/TPM count once "
        "across all of them (and this region's prefix index lives there). Empty keeps both in this "
        "process, so each region enforces the full limits alone. While Redis is unreachable each "
        "process counts alone, retrying Redis every 5 s: a key gets at most its limit per region "
        "process per minute, plus what Redis had counted",
    )
    load_refresh_ms: int = setting(200, "milliseconds between engine load polls for routing")
    admission_overcommit: float = setting(
        2.0, "turns admitted to the engines per engine batch slot; more wait in the fair queue"
    )
    admission_reserve: float = setting(
        0.125, "share of the engines' batch slots the free tier may not fill, kept for paying tiers"
    )
    admission_max_waiting: int = setting(1000, "most turns waiting for admission; more are shed")
    default_output_tokens: int = setting(
        1024, "output tokens reserved against TPM limits when a turn does not set max_tokens"
    )
    quota_refresh_ms: int = setting(
        30_000, "milliseconds between month-to-date usage reads from billing for quotas"
    )
    safety_judge_model: str = setting(
        "", "model the judge backend asks; empty uses the turn's own model family's default"
    )
    conversation_retention_days: int = setting(
        30, "days a deleted conversation's content is kept before its purge unless its tenant sets them"
    )
    purge_interval_s: float = setting(3600.0, "seconds between sweeps that purge deleted conversations")
    purge_batch: int = setting(100, "deleted conversations read per batch of a purge sweep")
    summaries_enabled: bool = setting(
        True, "summarise the oldest turns of a conversation too long for the window"
    )
    summary_model: str = setting(
        "", "model that writes conversation summaries; empty: the smallest chat model"
    )
    summary_max_tokens: int = setting(256, "most tokens of a conversation summary")
    memory_extractor: str = setting(
        "rules", "how end users' facts are learned after turns: rules (first-person patterns) or model"
    )
    memory_model: str = setting(
        "", "model that extracts end users' facts with memory_extractor=model; empty: the smallest chat model"
    )
    memory_max_tokens: int = setting(256, "most tokens of the memory model's reply (JSON of the facts)")
    background_tokens_per_day: int = setting(
        200_000,
        "most tokens a day (UTC) spent on a tenant's summaries and memory extraction unless its "
        "policy sets them; 0 no daily cap",
    )
    record_spool_dir: str = setting(
        "", "folder of the spool of turn records the store refused; empty: beside an SQLite zone store"
    )
    zone_store_url: str = setting(
        "",
        "SQLAlchemy URL of the zone's conversation store; empty means sqlite:///$LLMMESH_HOME/zone-ZONE.db",
    )

    def zone_store_database_url(self) -> str:
        """The configured zone store URL, or the embedded SQLite file of the zone."""
        return self.zone_store_url or f"sqlite:///{mesh_home() / f'zone-{self.zone}.db'}"

    def engine_address_list(self) -> list[str]:
        return [a.strip() for a in self.engine_addresses.split(",") if a.strip()]
