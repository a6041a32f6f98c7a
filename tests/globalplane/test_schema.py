"""The global store's schema: CockroachDB DDL, GLOBAL locality, and no conversation content."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.schema import CreateTable
from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

from llmmesh.globalplane import schema
from llmmesh.globalplane.migrations import MIGRATIONS
from llmmesh.globalplane.store import GlobalStore, global_locality_statements

COCKROACH = CockroachDBDialect_psycopg()
POSTGRESQL = sa.create_engine("postgresql+psycopg://").dialect  # no connection is made

# Every column the global plane may hold. A new column must be added here
# on purpose, after checking it cannot carry prompt or completion text.
ALLOWED_COLUMNS: dict[str, set[str]] = {
    "tenants": {
        "id", "name", "zone", "tier", "rpm_limit", "tpm_limit", "monthly_token_quota",
        "allowed_models", "create_time", "conversation_retention_days", "memory_enabled",
        "max_files", "max_vector_stores", "max_memories_per_user", "delete_time",
        "background_tokens_per_day",
    },
    "api_keys": {
        "id", "tenant_id", "display_prefix", "secret_sha256", "create_time", "expire_time", "revoke_time",
    },
    "policy_version": {"id", "version"},
    "models": {
        "name", "tier", "context_window", "tokenizer_family", "chat_template_family",
        "default_for_tiers", "allowed_tiers", "retired", "canary_of", "canary_percent", "kind",
    },
    "model_prices": {"model", "revision", "input_per_1k_usd", "output_per_1k_usd", "effective_time"},
    "usage_records": {
        "request_id", "tenant_id", "model", "region", "period", "input_tokens", "output_tokens",
        "cached_input_tokens", "cost_usd", "end_time", "ingest_time", "continues_request_id",
        # An opaque id the tenant chose for its end user (a hash, as OpenAI advises), not content.
        "end_user",
        # "turn", "summary" or "memory": a label, not content.
        "purpose",
    },
    "usage_totals": {"tenant_id", "period", "input_tokens", "output_tokens", "requests", "cost_usd"},
    # Admin requests only (tenants, keys, models): no RPC that carries a turn is audited.
    "audit_events": {"id", "event_time", "actor", "method", "target", "request_fields"},
    # What a region says of itself in a heartbeat: names, an address, counts, a place, a time.
    "region_reports": {
        "region", "zone", "chat_address", "health", "capacity", "queue_depth", "models", "location",
        "engine_pods", "healthy_engine_pods", "model_pods", "heartbeat_time",
    },
}  # fmt: skip
CONTENT_WORDS = frozenset(
    {"message", "conversation", "content", "prompt", "completion", "text", "body", "transcript", "turn"}
)


def _names_content(name: str) -> bool:
    return any(word.rstrip("s") in CONTENT_WORDS for word in name.lower().split("_"))


def _ddl(table: sa.Table) -> str:
    return " ".join(str(CreateTable(table).compile(dialect=COCKROACH)).split())


def test_cockroachdb_ddl_is_exact_and_keyed_for_idempotency() -> None:
    usage = _ddl(schema.usage_records)
    assert usage.startswith("CREATE TABLE usage_records (")
    assert "request_id VARCHAR(128) NOT NULL" in usage
    assert "PRIMARY KEY (request_id, tenant_id)" in usage
    assert "cost_usd NUMERIC NOT NULL" in usage
    assert "FOREIGN KEY(tenant_id) REFERENCES tenants (id)" in usage
    prices = _ddl(schema.model_prices)
    assert "input_per_1k_usd NUMERIC NOT NULL" in prices
    assert "PRIMARY KEY (model, revision)" in prices
    keys = _ddl(schema.api_keys)
    assert "secret_sha256 VARCHAR(64) NOT NULL" in keys and "UNIQUE (secret_sha256)" in keys
    assert "create_time TIMESTAMP WITH TIME ZONE NOT NULL" in keys
    assert "UNIQUE (name)" in _ddl(schema.tenants)
    assert "PRIMARY KEY (tenant_id, period)" in _ddl(schema.usage_totals)
    assert "FLOAT" not in " ".join(_ddl(t) for t in schema.metadata.sorted_tables).upper()


def test_decimals_are_numeric_on_servers_and_strings_on_sqlite() -> None:
    cost = schema.usage_records.c.cost_usd.type
    assert cost.compile(dialect=COCKROACH) == "NUMERIC"
    assert cost.compile(dialect=POSTGRESQL) == "NUMERIC"
    assert cost.compile(dialect=SQLiteDialect_pysqlite()) == "VARCHAR(80)"


def test_ingestion_insert_compiles_to_on_conflict_do_nothing_for_cockroachdb() -> None:
    stmt = (
        postgresql.insert(schema.usage_records)
        .values(request_id="r", tenant_id="t")
        .on_conflict_do_nothing()
        .returning(schema.usage_records.c.request_id)
    )
    sql = str(stmt.compile(dialect=COCKROACH))
    assert "ON CONFLICT DO NOTHING RETURNING usage_records.request_id" in sql


def test_control_plane_tables_are_global_in_cockroachdb() -> None:
    assert global_locality_statements() == [
        "ALTER TABLE tenants SET LOCALITY GLOBAL",
        "ALTER TABLE api_keys SET LOCALITY GLOBAL",
        "ALTER TABLE policy_version SET LOCALITY GLOBAL",
        "ALTER TABLE models SET LOCALITY GLOBAL",
        "ALTER TABLE model_prices SET LOCALITY GLOBAL",
    ]
    quoted = global_locality_statements(POSTGRESQL)
    assert all(s.endswith(" SET LOCALITY GLOBAL") for s in quoted)


def test_the_metadata_holds_only_allow_listed_columns() -> None:
    assert {t.name: {c.name for c in t.columns} for t in schema.metadata.sorted_tables} == ALLOWED_COLUMNS


@pytest.mark.parametrize("store_kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_the_created_schema_holds_no_conversation_content(
    request: pytest.FixtureRequest, store_kind: str
) -> None:
    store: GlobalStore
    if store_kind == "sqlite":
        store = request.getfixturevalue("sqlite_store")
    else:
        store = request.getfixturevalue("postgres_stores")()
    inspector = sa.inspect(store.engine)
    tables = set(inspector.get_table_names())
    # Beside the metadata's tables, the revision the store's migrations reached (one short string).
    assert tables == set(ALLOWED_COLUMNS) | {MIGRATIONS.version_table}
    assert {c["name"] for c in inspector.get_columns(MIGRATIONS.version_table)} == {"version_num"}
    tables.discard(MIGRATIONS.version_table)
    assert not any(map(_names_content, tables))
    for table in tables:
        columns = {c["name"] for c in inspector.get_columns(table)}
        assert columns == ALLOWED_COLUMNS[table], table
        # A column named after content may only hold a number or a flag about it (a
        # tenant's conversation retention in days), never text.
        for column in inspector.get_columns(table):
            if _names_content(column["name"]):
                assert isinstance(column["type"], sa.Integer | sa.Boolean), (table, column["name"])
        # No unbounded text column anywhere: every string has a declared length.
        for column in inspector.get_columns(table):
            if isinstance(column["type"], sa.String):
                assert column["type"].length is not None, (table, column["name"])
