"""The global store's tables at revision 0001, the first with migrations.

Frozen here: later revisions change the tables with operations of their own
and never through this module; :mod:`llmmesh.globalplane.schema` is the
current shape.
"""

from __future__ import annotations

import sqlalchemy as sa

from llmmesh.core.sqlstore import ExactDecimal, UtcDateTime

tables = sa.MetaData()

audit_events = sa.Table(
    "audit_events",
    tables,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
    sa.Column("event_time", UtcDateTime(timezone=True), nullable=False),
    sa.Column("actor", sa.String(length=256), nullable=False),
    sa.Column("method", sa.String(length=64), nullable=False),
    sa.Column("target", sa.String(length=128), nullable=False),
    sa.Column("request_fields", sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
)

sa.Index("ix_audit_events_event_time", audit_events.c.event_time)
models = sa.Table(
    "models",
    tables,
    sa.Column("name", sa.String(length=128), nullable=False),
    sa.Column("tier", sa.String(length=16), nullable=False),
    sa.Column("context_window", sa.Integer(), nullable=False),
    sa.Column("tokenizer_family", sa.String(length=64), nullable=False),
    sa.Column("chat_template_family", sa.String(length=64), nullable=False),
    sa.Column("default_for_tiers", sa.JSON(), nullable=False),
    sa.Column("allowed_tiers", sa.JSON(), nullable=False),
    sa.Column("retired", sa.Boolean(), nullable=True),
    sa.Column("canary_of", sa.String(length=128), nullable=True),
    sa.Column("canary_percent", sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint("name"),
)

policy_version = sa.Table(
    "policy_version",
    tables,
    sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
)

region_reports = sa.Table(
    "region_reports",
    tables,
    sa.Column("region", sa.String(length=64), nullable=False),
    sa.Column("zone", sa.String(length=16), nullable=False),
    sa.Column("chat_address", sa.String(length=300), nullable=False),
    sa.Column("health", sa.String(length=16), nullable=False),
    sa.Column("capacity", sa.BigInteger(), nullable=False),
    sa.Column("queue_depth", sa.BigInteger(), nullable=False),
    sa.Column("models", sa.JSON(), nullable=False),
    sa.Column("location", sa.String(length=64), nullable=True),
    sa.Column("engine_pods", sa.Integer(), nullable=False),
    sa.Column("healthy_engine_pods", sa.Integer(), nullable=False),
    sa.Column("heartbeat_time", UtcDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("region"),
)

tenants = sa.Table(
    "tenants",
    tables,
    sa.Column("id", sa.String(length=64), nullable=False),
    sa.Column("name", sa.String(length=128), nullable=False),
    sa.Column("zone", sa.String(length=16), nullable=False),
    sa.Column("tier", sa.String(length=16), nullable=False),
    sa.Column("rpm_limit", sa.BigInteger(), nullable=False),
    sa.Column("tpm_limit", sa.BigInteger(), nullable=False),
    sa.Column("monthly_token_quota", sa.BigInteger(), nullable=False),
    sa.Column("allowed_models", sa.JSON(), nullable=False),
    sa.Column("create_time", UtcDateTime(timezone=True), nullable=False),
    sa.Column("conversation_retention_days", sa.Integer(), server_default="0", nullable=False),
    sa.Column("memory_enabled", sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("name"),
)

sa.Index("ix_tenants_zone", tenants.c.zone)
api_keys = sa.Table(
    "api_keys",
    tables,
    sa.Column("id", sa.String(length=64), nullable=False),
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("display_prefix", sa.String(length=32), nullable=False),
    sa.Column("secret_sha256", sa.String(length=64), nullable=False),
    sa.Column("create_time", UtcDateTime(timezone=True), nullable=False),
    sa.Column("expire_time", UtcDateTime(timezone=True), nullable=True),
    sa.Column("revoke_time", UtcDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(
        ["tenant_id"],
        ["tenants.id"],
    ),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("secret_sha256"),
)

sa.Index("ix_api_keys_tenant_id", api_keys.c.tenant_id)
model_prices = sa.Table(
    "model_prices",
    tables,
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("revision", sa.Integer(), autoincrement=False, nullable=False),
    sa.Column("input_per_1k_usd", ExactDecimal(), nullable=False),
    sa.Column("output_per_1k_usd", ExactDecimal(), nullable=False),
    sa.Column("effective_time", UtcDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(
        ["model"],
        ["models.name"],
    ),
    sa.PrimaryKeyConstraint("model", "revision"),
)

usage_records = sa.Table(
    "usage_records",
    tables,
    sa.Column("request_id", sa.String(length=128), nullable=False),
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("model", sa.String(length=128), nullable=False),
    sa.Column("region", sa.String(length=64), nullable=False),
    sa.Column("period", sa.String(length=7), nullable=False),
    sa.Column("input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cost_usd", ExactDecimal(), nullable=False),
    sa.Column("end_time", UtcDateTime(timezone=True), nullable=True),
    sa.Column("ingest_time", UtcDateTime(timezone=True), nullable=False),
    sa.Column("continues_request_id", sa.String(length=128), nullable=True),
    sa.Column("end_user", sa.String(length=256), nullable=True),
    sa.ForeignKeyConstraint(
        ["tenant_id"],
        ["tenants.id"],
    ),
    sa.PrimaryKeyConstraint("request_id", "tenant_id"),
)

sa.Index("ix_usage_records_request_id", usage_records.c.request_id)
sa.Index(
    "ix_usage_records_tenant_end_user",
    usage_records.c.tenant_id,
    usage_records.c.end_user,
    usage_records.c.period,
)
sa.Index("ix_usage_records_tenant_period", usage_records.c.tenant_id, usage_records.c.period)
usage_totals = sa.Table(
    "usage_totals",
    tables,
    sa.Column("tenant_id", sa.String(length=64), nullable=False),
    sa.Column("period", sa.String(length=7), nullable=False),
    sa.Column("input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("requests", sa.BigInteger(), nullable=False),
    sa.Column("cost_usd", ExactDecimal(), nullable=False),
    sa.ForeignKeyConstraint(
        ["tenant_id"],
        ["tenants.id"],
    ),
    sa.PrimaryKeyConstraint("tenant_id", "period"),
)
