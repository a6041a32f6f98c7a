"""The retrieval tables' CockroachDB DDL, compiled with the cockroachdb dialect (no server needed)."""

from __future__ import annotations

import pytest
from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

from llmmesh.region.vector_store_ddl import create_table_statements, residency_statements
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.region.zone_store.ddl import ZoneRegion

COCKROACH = CockroachDBDialect_psycopg()
MESH = [ZoneRegion("eu", "eu-west", "europe-west1"), ZoneRegion("us", "us-east", "us-east1")]


def flat(statement: str) -> str:
    return " ".join(statement.split())


def test_chunks_hold_vectors_under_a_vector_index_and_text_under_an_inverted_one() -> None:
    statements = [flat(s) for s in create_table_statements(384, COCKROACH)]
    creates = {s.split()[2]: s for s in statements if s.startswith("CREATE TABLE")}
    assert set(creates) == {t.name for t in RETRIEVAL_TABLES}
    assert "embedding VECTOR(384) NOT NULL" in creates["retrieval_chunks"]
    assert all("home_region VARCHAR(64) NOT NULL" in s for s in creates.values())
    assert (
        "CREATE VECTOR INDEX ix_retrieval_chunks_embedding ON retrieval_chunks "
        "(tenant_id, vector_store_id, embedding vector_cosine_ops)" in statements
    )
    assert any(s.startswith("CREATE INVERTED INDEX ix_retrieval_chunks_text") for s in statements)
    assert any("text_search TSVECTOR AS (to_tsvector('english', text)) STORED" in s for s in statements)
    # The runtime schema keeps its own types: only the DDL's copy says VECTOR.
    assert "VECTOR" not in str(RETRIEVAL_TABLES[-1].c.embedding.type.compile(dialect=COCKROACH))
    with pytest.raises(ValueError, match="dimensions"):
        create_table_statements(0, COCKROACH)


def test_every_retrieval_table_is_regional_by_row_inside_its_zone() -> None:
    statements = residency_statements(MESH, COCKROACH)
    for table in RETRIEVAL_TABLES:
        assert f"ALTER TABLE {table.name} SET LOCALITY REGIONAL BY ROW AS crdb_region" in statements
        add = next(s for s in statements if s.startswith(f"ALTER TABLE {table.name} ADD COLUMN"))
        # No ELSE: a row homed in an unknown region computes NULL, which NOT NULL refuses.
        assert "CASE home_region WHEN 'eu-west' THEN 'europe-west1' WHEN 'us-east' THEN 'us-east1' END" in add
        assert "ELSE" not in add
    with pytest.raises(ValueError, match="twice"):
        residency_statements([*MESH, MESH[0]], COCKROACH)
