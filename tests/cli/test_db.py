"""``llmmesh db``: the stores' migrations on SQLite and PostgreSQL, from an
empty database and from the previous release's (tables made before
migrations, rows in them); drift reported by ``check``; the CockroachDB
statements ``upgrade --sql`` prints, checked against CockroachDB's recorded
syntax; and a plane on CockroachDB that refuses a store not upgraded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmmesh.cli.main import main
from llmmesh.core.migrations import StoreNotMigrated, drift, revision, upgrade
from llmmesh.core.sqlstore import SqlStore, create_store_engine
from llmmesh.globalplane import schema as global_schema
from llmmesh.globalplane.migrations import MIGRATIONS as GLOBAL
from llmmesh.globalplane.migrations import baseline as global_baseline
from llmmesh.region.knowledge.memory_store import memories
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.region.zone_store import schema as zone_schema
from llmmesh.region.zone_store.migrations import MIGRATIONS as ZONE
from llmmesh.region.zone_store.migrations import baseline as zone_baseline
from tests.cockroachdb_syntax import fold, problems
from tests.conftest import fresh_schema

PRODUCTION = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "production.toml"


@pytest.fixture(params=["sqlite", "postgresql"])
def two_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A global and a zone store URL, empty, on SQLite or PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'global.db'}", f"sqlite:///{tmp_path / 'zone-us.db'}"
        return
    postgres_url = request.getfixturevalue("postgres_url")
    with fresh_schema(postgres_url) as one, fresh_schema(postgres_url) as other:
        yield one, other


def _db(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["db", *args])
    out, err = capsys.readouterr()
    return status, out + err


def _state(url: str, migrations: object) -> tuple[str | None, list[str]]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return revision(conn, migrations), drift(conn, migrations)  # type: ignore[arg-type]
    finally:
        engine.dispose()


def test_an_empty_database_is_upgraded_to_exactly_the_current_tables(
    two_urls: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    global_url, zone_url = two_urls
    targets = ("--global-url", global_url, "--zone-url", f"us={zone_url}")
    status, out = _db(capsys, "check", *targets)
    assert status == 1 and "revision none" in out and "drift: table missing: messages" in out
    status, out = _db(capsys, "upgrade", *targets)
    assert status == 0, out
    assert f"zone store us {_shown(zone_url)}: empty -> {ZONE.head()}" in out
    assert f"global store {_shown(global_url)}: empty -> {GLOBAL.head()}" in out
    # The head revision builds the schema modules' tables exactly: a change to them needs a revision.
    assert _state(global_url, GLOBAL) == (GLOBAL.head(), [])
    assert _state(zone_url, ZONE) == (ZONE.head(), [])
    status, out = _db(capsys, "check", *targets)
    assert status == 0 and out.count(": current") == 2, out
    status, out = _db(capsys, "upgrade", *targets)
    assert status == 0 and out.count("already at") == 2, out


def test_the_previous_releases_stores_are_adopted_with_every_row(
    two_urls: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    global_url, zone_url = two_urls
    # What the release before migrations left: the tables as it created them (the baseline's,
    # revision 0001), rows, no revision recorded.
    for url, metadata in ((global_url, global_baseline.tables), (zone_url, zone_baseline.tables)):
        engine = sa.create_engine(url)
        metadata.create_all(engine)
        engine.dispose()
    engine = sa.create_engine(global_url)
    with engine.begin() as conn:
        conn.execute(sa.insert(global_schema.policy_version).values(id=1, version=41))
    engine.dispose()
    status, out = _db(capsys, "upgrade", "--global-url", global_url, "--zone-url", f"us={zone_url}")
    assert status == 0, out
    assert _state(global_url, GLOBAL) == (GLOBAL.head(), [])
    assert _state(zone_url, ZONE) == (ZONE.head(), [])
    engine = sa.create_engine(global_url)
    with engine.connect() as conn:
        assert conn.execute(sa.select(global_schema.policy_version.c.version)).scalar_one() == 41
    engine.dispose()
    # The releases' own changes came after the baseline.
    assert GLOBAL.revisions() == ["0001", "0002", "0003", "0004", "0005", "0006"]


def test_a_store_of_the_previous_revision_gets_this_releases_columns(tmp_path: Path) -> None:
    """A global store at revision 0001 with a tenant gets 0002's tenant caps, 0 (the region's
    default), 0003's delete time, none (the tenant exists), 0004's daily background cap, 0,
    0005's per-model pods of a kept heartbeat, and 0006's model kind, none (read as chat)."""
    url = f"sqlite:///{tmp_path / 'global.db'}"
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            upgrade(conn, GLOBAL, "0001")
            conn.execute(
                sa.insert(global_baseline.tenants).values(
                    id="ten_a",
                    name="a",
                    zone="us",
                    tier="pro",
                    rpm_limit=0,
                    tpm_limit=0,
                    monthly_token_quota=0,
                    allowed_models=[],
                    create_time=sa.func.now(),
                )
            )
            conn.execute(
                sa.insert(global_baseline.models).values(
                    name="m",
                    tier="small",
                    context_window=8,
                    tokenizer_family="f",
                    chat_template_family="f",
                    default_for_tiers=[],
                    allowed_tiers=[],
                )
            )
        with engine.begin() as conn:
            upgrade(conn, GLOBAL)
        with engine.connect() as conn:
            assert (revision(conn, GLOBAL), drift(conn, GLOBAL)) == ("0006", [])
            row = conn.execute(sa.select(global_schema.tenants)).one()
            assert conn.execute(sa.select(global_schema.models.c.kind)).scalar_one() is None
        assert (row.max_files, row.max_vector_stores, row.max_memories_per_user) == (0, 0, 0)
        assert row.delete_time is None and row.background_tokens_per_day == 0
    finally:
        engine.dispose()


def test_check_names_the_drift_of_a_store_changed_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'zone-us.db'}"
    assert _db(capsys, "upgrade", "--zone-url", f"us={url}")[0] == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_usage_outbox_pending")
        conn.exec_driver_sql("CREATE TABLE conversations_copy (id TEXT)")
    engine.dispose()
    status, out = _db(capsys, "check", "--zone-url", f"us={url}")
    assert status == 1
    assert f"revision {ZONE.head()}, head {ZONE.head()}: NOT current" in out
    assert "drift: index missing: usage_outbox: ix_usage_outbox_pending" in out
    # Another store's table (or anything else this store does not own) is not drift.
    assert "conversations_copy" not in out


def test_the_cockroachdb_statements_printed_are_cockroachdbs_syntax(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out = _db(capsys, "upgrade", "--sql", "--config", str(PRODUCTION))
    assert status == 0, out
    script = _statements(out)
    assert [p for s in script for p in problems(s)] == []
    # Every zone table homed by row in its zone's super region; the control-plane tables GLOBAL.
    assert 'ALTER DATABASE llmmesh ADD SUPER REGION "eu" VALUES "europe-west1", "europe-west3"' in script
    # The end users' files, chunks and memories too: their tables made while empty, then homed.
    homed = [*zone_schema.ZONE_TABLES, *RETRIEVAL_TABLES, memories]
    for table in homed:
        assert f"ALTER TABLE {table.name} SET LOCALITY REGIONAL BY ROW AS crdb_region" in script
    assert any(s.startswith("CREATE TABLE IF NOT EXISTS user_memories") for s in script)
    for table in global_schema.CONTROL_PLANE_TABLES:
        assert f"ALTER TABLE {table.name} SET LOCALITY GLOBAL" in script
    assert "INSERT INTO llmmesh_global_revision (version_num) VALUES ('0001')" in " ".join(script)


def test_sql_for_one_store_and_clear_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _db(capsys, "upgrade", "--sql", "--dialect", "postgresql", "--only", "global")
    assert status == 0 and "CREATE TABLE tenants" in out and "conversations" not in out
    status, out = _db(capsys, "upgrade", "--only", "mars")
    assert status == 2 and "--only names no store: mars (stores: eu, global, us)" in out
    status, out = _db(capsys, "upgrade", "--zone-url", "us")
    assert status == 2 and "--zone-url takes ZONE=URL" in out
    status, out = _db(capsys, "upgrade", "--dialect", "sqlite")
    assert status == 2 and "give --sql too" in out
    url = "cockroachdb+psycopg://root@db:26257/llmmesh"
    status, out = _db(capsys, "upgrade", "--sql", "--zone-url", f"us={url}")
    assert status == 2 and "needs the mesh's regions: give --config" in out
    # The chart's migration Job names the regions itself.
    status, out = _db(
        capsys,
        "upgrade",
        "--sql",
        "--zone-url",
        f"us={url}",
        "--region",
        "us:us-east=us-east1",
        "--region",
        "us:us-west",
    )
    assert status == 0 and 'ADD SUPER REGION "us" VALUES "us-east1", "us-west"' in out
    status, out = _db(capsys, "upgrade", "--sql", "--zone-url", f"us={url}", "--region", "us-east")
    assert status == 2 and "--region takes ZONE:REGION[=DATABASE_REGION]" in out


def test_a_plane_on_cockroachdb_refuses_a_store_not_upgraded(postgres_url: str) -> None:
    """The cockroachdb dialect over PostgreSQL's wire (as far as the driver
    goes here): the plane reads the revision and refuses, naming the command."""
    with fresh_schema(postgres_url) as url:
        engine = sa.create_engine(url.replace("postgresql+psycopg", "cockroachdb+psycopg"))
        store = SqlStore(engine)
        try:
            with pytest.raises(
                StoreNotMigrated, match=rf"revision none; this release needs {ZONE.head()}: run `llmmesh db"
            ):
                store.migrate(ZONE)
        finally:
            engine.dispose()


def _statements(sql: str) -> list[str]:
    """The statements of a printed script (``--`` comments dropped), each folded to one line."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return [fold(s) for s in "\n".join(lines).split(";") if s.strip()]


def _shown(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)
