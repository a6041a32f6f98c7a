"""Settings of the global control plane process."""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.core.config import setting
from llmmesh.core.mtls import MeshTlsSettings


@dataclass(frozen=True)
class GlobalSettings(MeshTlsSettings):
    """Everything the global plane needs to start; see :func:`llmmesh.core.config.load`."""

    host: str = setting("127.0.0.1", "Interface the gRPC server binds.")
    port: int = setting(0, "Port the gRPC server binds; 0 picks a free one.")
    advertise_address: str = setting(
        "", "host:port the regions and the edge dial; empty: the bound host:port (a 0.0.0.0 bind needs one)."
    )
    metrics_port: int = setting(
        0, "Port of the HTTP /metrics endpoint (llmmesh_global_* series); 0 picks one, -1 serves none."
    )
    ready_file: str = setting("", "Path of a JSON file written with the address once serving.")
    database_url: str = setting(
        "", "SQLAlchemy URL of the global store; empty means sqlite:///$LLMMESH_HOME/global.db."
    )
    zones: str = setting(
        "",
        "Comma-separated zones of the topology (llmmesh up passes its config's); a tenant is created "
        "only in one of them or of a region that has reported, unless asked to allow an empty zone. "
        "Empty: any zone name is accepted.",
    )
    dev_tenant: str = setting("dev", "Name of the development tenant created at start.")
    dev_zone: str = setting("us", "Zone the development tenant is pinned to.")
    dev_tier: str = setting("pro", "Tier of the development tenant: free, pro or enterprise.")
    dev_key: str = setting("sk-llmmesh-dev", "Secret of the development API key; empty for no dev tenant.")
    default_model: str = setting("llmmesh-tiny", "Name of the model the catalog starts with.")
    default_model_context_window: int = setting(4096, "Context window of the default model, in tokens.")
    default_model_input_per_1k_usd: str = setting("0.0005", "Default model price per 1,000 input tokens.")
    default_model_output_per_1k_usd: str = setting("0.0015", "Default model price per 1,000 output tokens.")
    embedding_model: str = setting(
        "llmmesh-tiny-embed", "Name of the embedding model the catalog starts with; empty for none."
    )
    embedding_model_context_window: int = setting(
        2048, "Most tokens one input of the embedding model may have."
    )
    embedding_model_input_per_1k_usd: str = setting(
        "0.00002", "Embedding model price per 1,000 input tokens."
    )
    heartbeat_interval_ms: int = setting(1000, "Milliseconds between the heartbeats regions send.")
    missed_heartbeats_until_down: int = setting(3, "Missed heartbeats after which a region counts as down.")
