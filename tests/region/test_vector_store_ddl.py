"""The retrieval tables' CockroachDB DDL, compiled with the cockroachdb
dialect (no server needed) and checked against CockroachDB's recorded
syntax (``tests/cockroachdb_syntax.py``)."""

from __future__ import annotations

import pytest
from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

from llmmesh.region.knowledge.vector_store_ddl import (
    MIN_VERSION,
    create_table_statements,
    residency_statements,
)
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.region.zone_store.ddl import ZoneRegion
from tests.cockroachdb_syntax import TARGET, fold, problems

COCKROACH = CockroachDBDialect_psycopg()
MESH = [ZoneRegion("eu", "eu-west", "europe-west1"), ZoneRegion("us", "us-east", "us-east1")]


def test_each_table_is_one_statement_with_its_indexes_declared_in_it() -> None:
    statements = [fold(s) for s in create_table_statements(384, COCKROACH)]
    creates = {s.split()[5]: s for s in statements}
    assert all(s.startswith("CREATE TABLE IF NOT EXISTS") for s in statements)
    assert list(creates) == [t.name for t in RETRIEVAL_TABLES]
    chunks = creates["retrieval_chunks"]
    assert "embedding VECTOR(384) NOT NULL" in chunks
    assert "text_search TSVECTOR AS (to_tsvector('english', text)) STORED" in chunks
    assert chunks.endswith(
        "INDEX ix_retrieval_chunks_store (tenant_id, vector_store_id, file_id), "
        "INVERTED INDEX ix_retrieval_chunks_text (tenant_id, vector_store_id, text_search), "
        "VECTOR INDEX ix_retrieval_chunks_embedding "
        "(tenant_id, vector_store_id, embedding vector_cosine_ops))"
    )
    assert (
        "INDEX ix_retrieval_files_tenant_created (tenant_id, created_at, id))" in creates["retrieval_files"]
    )
    assert all("home_region VARCHAR(64) NOT NULL" in s for s in creates.values())
    # The runtime schema binds CockroachDB's vectors without fixing a width; only the DDL has one.
    assert str(RETRIEVAL_TABLES[-1].c.embedding.type.compile(dialect=COCKROACH)) == "VECTOR"
    with pytest.raises(ValueError, match="dimensions"):
        create_table_statements(0, COCKROACH)


def test_the_ddl_is_cockroachdb_syntax_from_the_release_with_cosine_vector_indexes() -> None:
    assert TARGET == MIN_VERSION
    ddl = [*create_table_statements(256, COCKROACH), *residency_statements(MESH, COCKROACH)]
    assert {s[:60]: problems(s) for s in ddl} == {s[:60]: [] for s in ddl}
    chunks = create_table_statements(256, COCKROACH)[-1]
    assert problems(chunks, (25, 3)) == ["vector_cosine_ops needs v25.4 (v25.4/vector-indexes)"]
    assert "VECTOR INDEX (prefix columns, vector) needs v25.2 (v25.2/vector-indexes)" in problems(
        chunks, (24, 3)
    )
    assert "VECTOR(n) needs v24.2 (v24.2/vector)" in problems(chunks, (24, 1))


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


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        (
            "SELECT id FROM t WHERE d @@ q ORDER BY ts_rank_cd(d, q) DESC",
            "unsupported: ts_rank_cd() (full-text-search, Unsupported features)",
        ),
        (
            "SELECT id FROM t WHERE d @@ websearch_to_tsquery('x')",
            "function not recorded: websearch_to_tsquery",
        ),
        ("CREATE INDEX ix ON t USING hnsw (v vector_cosine_ops)", "no recorded statement form"),
        ("SELECT id FROM t WHERE q && r", "operator not recorded: &&"),
        ("SELECT id FROM t ORDER BY v <#> CAST(:q AS VECTOR)", "operator not recorded: <#>"),
        ("SELECT unnest(a) FROM t", "function not recorded: unnest"),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, v VECTOR(3), VECTOR INDEX i (v vector_l1_ops))",
            "column type not recorded: a INT",
        ),
        ("CREATE TABLE t (v VECTOR(3), VECTOR INDEX i (v vector_l1_ops))", "operator class not recorded"),
        ("SELECT a::REGCLASS FROM t", "type not recorded: REGCLASS"),
    ],
)
def test_the_record_refuses_what_it_does_not_hold(statement: str, why: str) -> None:
    assert any(why in problem for problem in problems(statement)), problems(statement)
