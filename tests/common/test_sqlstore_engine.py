"""How create_store_engine sets SQLite up: a file database in write-ahead-log
mode with commits synced at checkpoints, its data visible to a second
engine at once; an in-memory one shared by every caller."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from llmmesh.core.sqlstore import create_store_engine


def pragma(engine: sa.Engine, name: str) -> object:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"PRAGMA {name}").scalar()


def test_a_file_database_uses_a_write_ahead_log(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'zone.db'}"
    writer = create_store_engine(url)
    reader = create_store_engine(url)  # another process's view, as a zone's second region has
    try:
        assert pragma(writer, "journal_mode") == "wal"
        assert pragma(writer, "synchronous") == 1  # NORMAL
        with writer.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (v INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES (7)")
        with reader.connect() as conn:
            assert conn.exec_driver_sql("SELECT v FROM t").scalar() == 7
        assert (tmp_path / "nested" / "zone.db-wal").exists()
    finally:
        writer.dispose()
        reader.dispose()


def test_an_in_memory_database_is_shared_and_has_no_log() -> None:
    engine = create_store_engine("sqlite://")
    try:
        assert pragma(engine, "journal_mode") == "memory"
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (v INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1
    finally:
        engine.dispose()


def test_a_url_naming_no_driver_gets_psycopg() -> None:
    # SQLAlchemy's default for both is psycopg2, which is not installed; no connection is made here.
    for url, dialect in (
        ("postgresql://llmmesh@db.internal:5432/llmmesh?sslmode=verify-full", "postgresql"),
        ("cockroachdb://llmmesh@crdb.internal:26257/llmmesh?sslmode=verify-full", "cockroachdb"),
        ("cockroachdb+psycopg://llmmesh@crdb.internal:26257/llmmesh", "cockroachdb"),
    ):
        engine = create_store_engine(url)
        try:
            assert (engine.dialect.name, engine.dialect.driver) == (dialect, "psycopg")
            assert engine.url.query == sa.make_url(url).query
        finally:
            engine.dispose()
