"""The zone store's CockroachDB DDL, compiled with the cockroachdb dialect (no server needed)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.ddl import ZoneRegion, create_table_statements, zone_residency_statements

COCKROACH = CockroachDBDialect_psycopg()
MESH = [
    ZoneRegion("eu", "eu-west", "europe-west1"),
    ZoneRegion("eu", "eu-central", "europe-central2"),
    ZoneRegion("us", "us-east", "us-east1"),
    ZoneRegion("us", "us-west", "us-west1"),
]


def flat(statement: str) -> str:
    return " ".join(statement.split())


def test_tables_compile_for_cockroachdb_with_exact_costs_and_idempotency_keys() -> None:
    statements = [flat(s) for s in create_table_statements(COCKROACH)]
    creates = {s.split()[2]: s for s in statements if s.startswith("CREATE TABLE")}
    tables = {"conversations", "messages", "usage_outbox", "turn_starts", "conversation_summaries"}
    assert tables <= set(creates)
    # A conversation is a tree of messages; its summaries are content of its zone too.
    assert "parent_id VARCHAR(64) DEFAULT '' NOT NULL" in creates["messages"]
    assert "PRIMARY KEY (conversation_id, through_message_id)" in creates["conversation_summaries"]
    assert "CREATE INDEX ix_conversations_deleted ON conversations (deleted_at)" in statements
    # Request ids are each tenant's own.
    assert "PRIMARY KEY (tenant_id, request_id)" in creates["turn_starts"]
    messages = creates["messages"]
    assert "cost_usd NUMERIC NOT NULL" in messages
    assert (
        'CONSTRAINT uq_messages_tenant_request_role_call UNIQUE (tenant_id, request_id, "role", tool_call_id)'
        in messages
    )
    assert "CONSTRAINT uq_messages_conversation_seq UNIQUE (conversation_id, seq)" in messages
    assert "FOREIGN KEY(conversation_id) REFERENCES conversations (id)" in messages
    assert "PRIMARY KEY (tenant_id, request_id)" in creates["usage_outbox"]
    assert "usage BYTEA NOT NULL" in creates["usage_outbox"]
    assert "deleted_at TIMESTAMP WITH TIME ZONE," in creates["conversations"]
    assert all("home_region VARCHAR(64) NOT NULL" in s for s in creates.values())
    assert "FLOAT" not in " ".join(statements).upper()
    assert (
        "CREATE INDEX ix_usage_outbox_pending ON usage_outbox (shipped_at, attempts, created_at)"
        in statements
    )
    assert "CREATE INDEX ix_turn_starts_tenant_continues ON turn_starts (tenant_id, continues)" in statements


def test_each_zone_is_one_super_region_of_its_own_database_regions() -> None:
    statements = zone_residency_statements("llmmesh", MESH, dialect=COCKROACH)
    assert statements[:2] == [
        "SET enable_super_regions = 'on'",
        'ALTER DATABASE llmmesh SET PRIMARY REGION "europe-west1"',
    ]
    assert [s for s in statements if " ADD REGION " in s] == [
        f'ALTER DATABASE llmmesh ADD REGION IF NOT EXISTS "{r}"'
        for r in ("europe-central2", "us-east1", "us-west1")
    ]
    assert [s for s in statements if "SUPER REGION" in s] == [
        'ALTER DATABASE llmmesh ADD SUPER REGION "eu" VALUES "europe-west1", "europe-central2"',
        'ALTER DATABASE llmmesh ADD SUPER REGION "us" VALUES "us-east1", "us-west1"',
    ]
    # Regions are added before the super regions that name them.
    last_region = max(i for i, s in enumerate(statements) if "REGION IF NOT EXISTS" in s)
    assert last_region < min(i for i, s in enumerate(statements) if "SUPER REGION" in s)


def test_every_zone_table_is_regional_by_row_homed_from_its_home_region() -> None:
    statements = zone_residency_statements("llmmesh", MESH, primary_region="us-east1")
    assert statements[1] == 'ALTER DATABASE llmmesh SET PRIMARY REGION "us-east1"'
    case = (
        "CASE home_region WHEN 'eu-west' THEN 'europe-west1' WHEN 'eu-central' THEN 'europe-central2' "
        "WHEN 'us-east' THEN 'us-east1' WHEN 'us-west' THEN 'us-west1' END"
    )
    for table in schema.ZONE_TABLES:
        add = f"ALTER TABLE {table.name} ADD COLUMN IF NOT EXISTS crdb_region crdb_internal_region NOT NULL"
        assert f"{add} AS ({case}) STORED" in statements
        locality = f"ALTER TABLE {table.name} SET LOCALITY REGIONAL BY ROW AS crdb_region"
        assert statements.index(locality) == statements.index(f"{add} AS ({case}) STORED") + 1
    # No ELSE: a row whose home region is unmapped is refused, never homed in some default region.
    assert not any(re.search(r"\bELSE\b", s) for s in statements)


def test_names_are_quoted_by_the_dialect() -> None:
    statements = zone_residency_statements("Mesh DB", [ZoneRegion("eu", "eu-west", "europe-west1")])
    assert statements[1] == 'ALTER DATABASE "Mesh DB" SET PRIMARY REGION "europe-west1"'
    assert "WHEN 'eu-west' THEN 'europe-west1' END" in statements[-2]


@pytest.mark.parametrize(
    ("regions", "primary", "message"),
    [
        ([], None, "no regions"),
        (
            [ZoneRegion("eu", "eu-west", "europe-west1"), ZoneRegion("us", "us-east", "europe-west1")],
            None,
            "zones",
        ),
        ([ZoneRegion("eu", "eu-west", "a"), ZoneRegion("eu", "eu-west", "b")], None, "named twice"),
        ([ZoneRegion("eu", "eu-west", "x'; DROP TABLE messages; --")], None, "malformed"),
        ([ZoneRegion("EU", "eu-west", "europe-west1")], None, "malformed"),
        ([ZoneRegion("eu", "eu-west", "europe-west1")], "us-east1", "primary region"),
    ],
)
def test_a_topology_that_would_break_residency_is_refused(
    regions: list[ZoneRegion], primary: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        zone_residency_statements("llmmesh", regions, primary_region=primary)
