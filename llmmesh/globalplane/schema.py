"""The global store's tables: control-plane metadata only, never conversation content.

Every column is an identifier, a count, a price, a cost, a limit or a time.
``tests/globalplane/test_schema.py`` holds the allow-list that keeps it so.
"""

from __future__ import annotations

import sqlalchemy as sa

from llmmesh.core.sqlstore import ExactDecimal, UtcDateTime

metadata = sa.MetaData()


tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("zone", sa.String(16), nullable=False, index=True),
    sa.Column("tier", sa.String(16), nullable=False),
    sa.Column("rpm_limit", sa.BigInteger, nullable=False),
    sa.Column("tpm_limit", sa.BigInteger, nullable=False),
    sa.Column("monthly_token_quota", sa.BigInteger, nullable=False),
    sa.Column("allowed_models", sa.JSON, nullable=False),
    sa.Column("create_time", UtcDateTime, nullable=False),
    # Days its deleted conversations are kept before their purge; 0: the region's default.
    sa.Column("conversation_retention_days", sa.Integer, nullable=False, server_default="0"),
    # Whether end users' facts are kept and used (region.knowledge.memory); off unless set.
    sa.Column("memory_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    # Most files, vector stores and facts per end user it keeps in its zone; 0: the region's default.
    sa.Column("max_files", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_vector_stores", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_memories_per_user", sa.Integer, nullable=False, server_default="0"),
    # Most tokens a day the mesh spends on its background work for it; 0: the region's default.
    sa.Column("background_tokens_per_day", sa.BigInteger, nullable=False, server_default="0"),
    # When it was deleted (PolicyService.DeleteTenant); null while it exists. The row
    # stays: its usage records refer to it, and its name stays taken.
    sa.Column("delete_time", UtcDateTime, nullable=True),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), nullable=False, index=True),
    sa.Column("display_prefix", sa.String(32), nullable=False),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("create_time", UtcDateTime, nullable=False),
    sa.Column("expire_time", UtcDateTime, nullable=True),
    sa.Column("revoke_time", UtcDateTime, nullable=True),
)

policy_version = sa.Table(
    "policy_version",
    metadata,
    # One row (id 1): bumped in the same transaction as every tenant or key change.
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("version", sa.BigInteger, nullable=False),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("tier", sa.String(16), nullable=False),
    sa.Column("context_window", sa.Integer, nullable=False),
    sa.Column("tokenizer_family", sa.String(64), nullable=False),
    sa.Column("chat_template_family", sa.String(64), nullable=False),
    sa.Column("default_for_tiers", sa.JSON, nullable=False),
    sa.Column("allowed_tiers", sa.JSON, nullable=False),
    # Added later, so nullable: a model of an older store is live and no canary.
    sa.Column("retired", sa.Boolean, nullable=True),
    sa.Column("canary_of", sa.String(128), nullable=True),
    sa.Column("canary_percent", sa.Integer, nullable=True),
    # "chat" or "embedding"; null in a store from before models had a kind (chat).
    sa.Column("kind", sa.String(16), nullable=True),
)


def stored_kind(kind: str | None) -> str:
    """A stored model's kind: a null one is from before models had a kind, when all were chat models."""
    return kind or "chat"


model_prices = sa.Table(
    "model_prices",
    metadata,
    # Price history: a new revision per price change; the highest is current,
    # older ones explain costs already billed.
    sa.Column("model", sa.String(128), sa.ForeignKey("models.name"), primary_key=True),
    sa.Column("revision", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("input_per_1k_usd", ExactDecimal, nullable=False),
    sa.Column("output_per_1k_usd", ExactDecimal, nullable=False),
    sa.Column("effective_time", UtcDateTime, nullable=False),
)

usage_records = sa.Table(
    "usage_records",
    metadata,
    # The primary key is what makes ingestion idempotent; tenants choose
    # their own request ids, so one tenant's id never hides another's turn.
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), primary_key=True),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("period", sa.String(7), nullable=False),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_input_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", ExactDecimal, nullable=False),
    sa.Column("end_time", UtcDateTime, nullable=True),
    sa.Column("ingest_time", UtcDateTime, nullable=False),
    # The turn a continuation's tokens belong to (that turn counts the request).
    sa.Column("continues_request_id", sa.String(128), nullable=True),
    # The tenant's own opaque id of the end user served (OpenAI's `user`), for abuse monitoring.
    sa.Column("end_user", sa.String(256), nullable=True),
    # What the tokens were spent on: "turn", or background work ("summary", "memory").
    sa.Column("purpose", sa.String(16), nullable=False, server_default="turn"),
    sa.Index("ix_usage_records_tenant_period", "tenant_id", "period"),
    sa.Index("ix_usage_records_tenant_end_user", "tenant_id", "end_user", "period"),
    sa.Index("ix_usage_records_request_id", "request_id"),
)

usage_totals = sa.Table(
    "usage_totals",
    metadata,
    # Per tenant and month, maintained in the transaction that inserts the records.
    sa.Column("tenant_id", sa.String(64), sa.ForeignKey("tenants.id"), primary_key=True),
    sa.Column("period", sa.String(7), primary_key=True),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", ExactDecimal, nullable=False),
)

audit_events = sa.Table(
    "audit_events",
    metadata,
    # One row per administrative change, written after the change succeeded.
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("event_time", UtcDateTime, nullable=False, index=True),
    # The caller's mesh identity (its certificate's URI), or "insecure".
    sa.Column("actor", sa.String(256), nullable=False),
    sa.Column("method", sa.String(64), nullable=False),
    # The tenant, key or model the change was made to.
    sa.Column("target", sa.String(128), nullable=False),
    # The request's fields (names, limits, tiers, prices; secrets never).
    sa.Column("request_fields", sa.JSON, nullable=False),
)

region_reports = sa.Table(
    "region_reports",
    metadata,
    # Each region's last heartbeat, so a restarted global plane routes at
    # once and every replica routes on the heartbeats any replica received
    # (globalplane.region_reports); a removed region's row is deleted.
    sa.Column("region", sa.String(64), primary_key=True),
    sa.Column("zone", sa.String(16), nullable=False),
    sa.Column("chat_address", sa.String(300), nullable=False),
    sa.Column("health", sa.String(16), nullable=False),
    sa.Column("capacity", sa.BigInteger, nullable=False),
    sa.Column("queue_depth", sa.BigInteger, nullable=False),
    sa.Column("models", sa.JSON, nullable=False),
    # "lat,lon" in degrees as the region reported them (text: no float column in this store).
    sa.Column("location", sa.String(64), nullable=True),
    sa.Column("engine_pods", sa.Integer, nullable=False),
    sa.Column("healthy_engine_pods", sa.Integer, nullable=False),
    # [[model, engine_pods, healthy_engine_pods], ...]; null or empty: the region did not say.
    sa.Column("model_pods", sa.JSON, nullable=True),
    sa.Column("heartbeat_time", UtcDateTime, nullable=False),
)

CONTROL_PLANE_TABLES = (tenants, api_keys, policy_version, models, model_prices)
"""Read everywhere, written rarely: GLOBAL tables in a multi-region CockroachDB."""
