"""``llmmesh db``: the stores' schema migrations, run by the operator.

- ``upgrade`` brings each store to this release's head revision
  (:mod:`llmmesh.core.migrations`): an empty database and an earlier
  release's alike. On CockroachDB it then applies the stores' locality,
  idempotently: every zone store's database becomes multi-region with a
  super region per zone and its tables ``REGIONAL BY ROW``
  (:mod:`llmmesh.region.zone_store.ddl`), and the global store's
  control-plane tables ``GLOBAL`` (:func:`llmmesh.globalplane.store.global_locality_statements`).
  Zones go first, so the database is multi-region before a table is made ``GLOBAL``.
  ``--sql`` prints every statement it would run instead, without a database.
- ``check`` reports each store's revision against the head and any drift
  between its tables and this release's; exit status 1 when a store is
  behind or drifted.
- ``revision`` (for developers) writes a new revision file from the
  difference between the head revision and the current tables.

The stores are those of a mesh config (``--config``; default: the
embedded mesh under ``$LLMMESH_HOME``), or the URLs given with
``--global-url`` and ``--zone-url ZONE=URL`` (a plane deployed on its own).
``--only`` keeps some of them: ``global`` or a zone's name. With URLs, the
locality on CockroachDB needs the regions of every zone the database holds
(``--region ZONE:REGION=DATABASE_REGION``, the primary first), which a
config names itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from sqlalchemy.schema import CreateIndex, CreateTable

from llmmesh.core.home import mesh_home
from llmmesh.core.migrations import MigrationSet, drift, revision, upgrade, upgrade_sql
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.globalplane.migrations import MIGRATIONS as GLOBAL_MIGRATIONS
from llmmesh.globalplane.store import default_database_url, global_locality_statements
from llmmesh.region.knowledge.memory_store import memories
from llmmesh.region.knowledge.vector_store_ddl import (
    DEFAULT_DIMENSIONS,
    create_table_statements,
    residency_statements,
)
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.region.zone_store.ddl import ZoneRegion, zone_residency_statements
from llmmesh.region.zone_store.migrations import MIGRATIONS as ZONE_MIGRATIONS
from llmmesh.topology.mesh_config import MeshConfig, MeshConfigError, default_mesh_config, load_mesh_config

_COCKROACH = "cockroachdb"


class DbCommandError(ValueError):
    """A store this command cannot work on; the message says why."""


@dataclass(frozen=True)
class StoreTarget:
    """One store: ``global`` or a zone's name, its URL and its migrations;
    a zone's regions with their CockroachDB regions, and the mesh's primary one."""

    name: str
    url: str
    migrations: MigrationSet
    regions: tuple[ZoneRegion, ...] = ()
    primary_region: str = ""
    embedding_dimensions: int = DEFAULT_DIMENSIONS

    @property
    def dialect(self) -> str:
        return sa.make_url(self.url).get_backend_name()

    def shown_url(self) -> str:
        return sa.make_url(self.url).render_as_string(hide_password=True)

    def locality_statements(self, dialect: sa.engine.Dialect | None = None) -> list[str]:
        """What keeps this store's rows where they belong on CockroachDB.

        A zone store: the super region of every zone whose store is this
        database, and each table's rows homed by region (all the zones'
        regions: one database holds them all). The global store: the
        database made multi-region (the mesh's regions, its primary one
        first), then its control-plane tables ``GLOBAL``.
        """
        if not self.regions:
            raise DbCommandError(
                f"the locality of the {_label(self)} needs the mesh's regions: "
                "give --config, or leave the locality alone with --no-locality"
            )
        database = sa.make_url(self.url).database or ""
        if not database:
            raise DbCommandError(f"the {_label(self)}'s URL names no database")
        if self.migrations is ZONE_MIGRATIONS:
            return [
                *zone_residency_statements(
                    database, self.regions, primary_region=self.primary_region, dialect=dialect
                ),
                *_knowledge_statements(
                    self.regions, self.embedding_dimensions, dialect or _cockroach_dialect()
                ),
            ]
        prep = (dialect or _cockroach_dialect()).identifier_preparer
        db, primary = prep.quote(database), prep.quote_identifier(self.primary_region)
        others = dict.fromkeys(
            r.database_region for r in self.regions if r.database_region != self.primary_region
        )
        return [
            f"ALTER DATABASE {db} SET PRIMARY REGION {primary}",
            *(f"ALTER DATABASE {db} ADD REGION IF NOT EXISTS {prep.quote_identifier(r)}" for r in others),
            *global_locality_statements(dialect),
        ]


def _knowledge_statements(
    regions: Sequence[ZoneRegion], dimensions: int, dialect: sa.engine.Dialect
) -> list[str]:
    """The zone's files, vector stores, chunks and end users' memories: their
    tables (a region creates missing ones too, but a table's locality is best
    set while it is empty) and each row homed in its zone, as conversations are."""
    memory_tables = [
        str(CreateTable(memories, if_not_exists=True).compile(dialect=dialect)).strip(),
        *(str(CreateIndex(i, if_not_exists=True).compile(dialect=dialect)).strip() for i in memories.indexes),
    ]
    return [
        *create_table_statements(dimensions, dialect),
        *memory_tables,
        *residency_statements(regions, dialect, (*RETRIEVAL_TABLES, memories)),
    ]


def _cockroach_dialect() -> sa.engine.Dialect:
    from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

    dialect: sa.engine.Dialect = CockroachDBDialect_psycopg()
    return dialect


def targets(args: argparse.Namespace) -> list[StoreTarget]:
    """The stores the arguments name, zones first, then the global store."""
    found: list[StoreTarget] = []
    if args.global_url or args.zone_url:
        regions = tuple(_region(text) for text in args.region or ())
        primary = regions[0].database_region if regions else ""
        for text in args.zone_url or ():
            zone, sep, url = text.partition("=")
            if not sep or not zone or not url:
                raise DbCommandError(f"--zone-url takes ZONE=URL, got {text!r}")
            found.append(StoreTarget(zone, url, ZONE_MIGRATIONS, regions, primary))
        if args.global_url:
            found.append(StoreTarget("global", args.global_url, GLOBAL_MIGRATIONS, regions, primary))
    elif args.region:
        raise DbCommandError("--region goes with --zone-url or --global-url; a config names its regions")
    else:
        found = _config_targets(_config(args.config))
    if args.only:
        names = {t.name for t in found}
        unknown = sorted(set(args.only) - names)
        if unknown:
            raise DbCommandError(
                f"--only names no store: {', '.join(unknown)} (stores: {', '.join(sorted(names))})"
            )
        found = [t for t in found if t.name in set(args.only)]
    return found


def _region(text: str) -> ZoneRegion:
    """``ZONE:REGION=DATABASE_REGION`` (``=DATABASE_REGION`` left out: the region's name)."""
    zone, sep, rest = text.partition(":")
    region, _, database_region = rest.partition("=")
    if not sep or not zone or not region:
        raise DbCommandError(f"--region takes ZONE:REGION[=DATABASE_REGION], got {text!r}")
    return ZoneRegion(zone, region, database_region or region)


def _config(path: Path | None) -> MeshConfig:
    if path is None:
        return default_mesh_config()
    try:
        return load_mesh_config(path)
    except (OSError, MeshConfigError) as err:
        raise DbCommandError(str(err)) from err


def _config_targets(config: MeshConfig) -> list[StoreTarget]:
    """The config's zone stores and its global store. Zones whose CockroachDB
    stores name one database share it, so each one's locality covers them all."""
    home = mesh_home()
    every = tuple(
        ZoneRegion(zone.name, r.name, r.database_region or r.name)
        for zone in config.zones
        for r in zone.regions
    )
    primary = every[0].database_region
    found = []
    for zone in config.zones:
        url = zone.store_database_url(home)
        sharing = {z.name for z in config.zones if _shared_database(z.store_database_url(home), url)} | {
            zone.name
        }
        regions = tuple(r for r in every if r.zone in sharing)
        found.append(StoreTarget(zone.name, url, ZONE_MIGRATIONS, regions, regions[0].database_region))
    global_url = config.global_store_url or default_database_url()
    found.append(StoreTarget("global", global_url, GLOBAL_MIGRATIONS, every, primary))
    return found


def _shared_database(one: str, other: str) -> bool:
    """Two CockroachDB URLs naming one database (each zone reaches the cluster through its own nodes)."""
    a, b = sa.make_url(one), sa.make_url(other)
    return a.get_backend_name() == b.get_backend_name() == _COCKROACH and a.database == b.database


def run_db(args: argparse.Namespace) -> int:
    try:
        if args.db_action == "revision":
            return _revision(args.store, args.message)
        chosen = targets(args)
        if args.db_action == "upgrade":
            if args.dialect and not args.sql:
                raise DbCommandError("--dialect chooses what --sql prints: give --sql too")
            if args.embedding_dimensions < 1:
                raise DbCommandError(
                    f"--embedding-dimensions must be at least 1, got {args.embedding_dimensions}"
                )
            chosen = [replace(t, embedding_dimensions=args.embedding_dimensions) for t in chosen]
            return _upgrade(chosen, sql=args.sql, dialect=args.dialect, locality=not args.no_locality)
        return _check(chosen, as_json=args.json)
    except DbCommandError as err:
        print(f"llmmesh db: {err}", file=sys.stderr)
        return 2
    except sa.exc.SQLAlchemyError as err:
        print(f"llmmesh db: the database refused: {err}", file=sys.stderr)
        return 1


def _upgrade(chosen: Sequence[StoreTarget], *, sql: bool, dialect: str, locality: bool) -> int:
    for target in chosen:
        name = dialect or target.dialect
        if sql:
            print(f"-- the {_label(target)} ({name}): {target.shown_url()}")
            print(upgrade_sql(target.migrations, name), end="")
            if locality and name == _COCKROACH:
                print("-- locality (and the zone store's retrieval and memory tables), each statement alone")
                print("".join(f"{statement};\n" for statement in target.locality_statements()), end="")
            continue
        engine = create_store_engine(target.url)
        try:
            with engine.begin() as conn:
                before = revision(conn, target.migrations)
                upgrade(conn, target.migrations)
                after = revision(conn, target.migrations)
            moved = "already at" if before == after else f"{before or 'empty'} ->"
            print(f"{_label(target)} {target.shown_url()}: {moved} {after}")
            if locality and engine.dialect.name == _COCKROACH:
                applied = _apply_locality(engine, target)
                print(f"{_label(target)}: {applied} locality statements applied")
        finally:
            engine.dispose()
    return 0


def _apply_locality(engine: sa.Engine, target: StoreTarget) -> int:
    """Run the locality statements one by one outside a transaction (CockroachDB
    runs multi-region schema changes only so); a super region that exists is
    altered to the zone's regions instead of added again."""
    existing: set[str] = set()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        database = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        if target.migrations is ZONE_MIGRATIONS:
            quoted = engine.dialect.identifier_preparer.quote(database)
            rows = conn.exec_driver_sql(f"SHOW SUPER REGIONS FROM DATABASE {quoted}")
            existing = {row[1] for row in rows}
        count = 0
        for statement in target.locality_statements(engine.dialect):
            words = statement.split()
            if words[3:6] == ["ADD", "SUPER", "REGION"] and words[6].strip('"') in existing:
                statement = statement.replace("ADD SUPER REGION", "ALTER SUPER REGION", 1)
            conn.exec_driver_sql(statement)
            count += 1
    return count


def _check(chosen: Sequence[StoreTarget], *, as_json: bool) -> int:
    reports = []
    differences_of: dict[str, list[str]] = {}
    for target in chosen:
        engine = create_store_engine(target.url)
        try:
            with engine.connect() as conn:
                current = revision(conn, target.migrations)
                differences = drift(conn, target.migrations)
        finally:
            engine.dispose()
        head = target.migrations.head()
        differences_of[target.name] = differences
        reports.append(
            {
                "store": target.name,
                "url": target.shown_url(),
                "revision": current,
                "head": head,
                "current": current == head and not differences,
                "drift": differences,
            }
        )
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        for report in reports:
            state = "current" if report["current"] else "NOT current"
            print(
                f"{report['store']} store {report['url']}: revision {report['revision'] or 'none'}, "
                f"head {report['head']}: {state}"
            )
            for line in differences_of[str(report["store"])]:
                print(f"  drift: {line}")
        if not all(r["current"] for r in reports):
            print("run `llmmesh db upgrade` to bring the stores to this release's schema", file=sys.stderr)
    return 0 if all(r["current"] for r in reports) else 1


def _revision(store: str, message: str) -> int:
    """Autogenerate a revision against an in-memory SQLite database at the head."""
    migrations = GLOBAL_MIGRATIONS if store == "global" else ZONE_MIGRATIONS
    engine = create_store_engine("sqlite://")
    try:
        with engine.begin() as conn:
            upgrade(conn, migrations)
            if not drift(conn, migrations):
                print(f"the {store} store's tables match its head revision: nothing to write")
                return 0
            number = f"{len(migrations.revisions()) + 1:04d}"
            script = command.revision(
                migrations.config(connection=conn), message=message, autogenerate=True, rev_id=number
            )
            print(f"wrote {getattr(script, 'path', script)}: check it (defaults are written as SQLite would)")
    finally:
        engine.dispose()
    return 0


def _label(target: StoreTarget) -> str:
    return "global store" if target.migrations is GLOBAL_MIGRATIONS else f"zone store {target.name}"


def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_action", required=True, metavar="ACTION")
    up = sub.add_parser(
        "upgrade", help="bring the stores to this release's schema (and locality, on CockroachDB)"
    )
    check = sub.add_parser(
        "check", help="report each store's revision and drift; exit 1 when one is not current"
    )
    for each in (up, check):
        each.add_argument("--config", type=Path, default=None, help="the mesh config whose stores to work on")
        each.add_argument("--global-url", default="", help="the global store's URL (instead of a config)")
        each.add_argument(
            "--zone-url", action="append", metavar="ZONE=URL", help="a zone store's URL (instead of a config)"
        )
        each.add_argument("--only", action="append", metavar="STORE", help="'global' or a zone's name")
        each.add_argument(
            "--region",
            action="append",
            metavar="ZONE:REGION[=DATABASE_REGION]",
            help="with URLs, on CockroachDB: every region of the zones the database holds, the primary first",
        )
    up.add_argument("--sql", action="store_true", help="print the statements instead of running them")
    up.add_argument(
        "--dialect",
        default="",
        choices=["", "sqlite", "postgresql", _COCKROACH],
        help="with --sql: the database kind to print for (default: each URL's)",
    )
    up.add_argument(
        "--no-locality", action="store_true", help="on CockroachDB, leave the tables' locality alone"
    )
    up.add_argument(
        "--embedding-dimensions",
        type=int,
        default=DEFAULT_DIMENSIONS,
        help="on CockroachDB, the width of the retrieval tables' VECTOR column: the regions' "
        f"--retrieval-embedding-dimensions (default {DEFAULT_DIMENSIONS})",
    )
    check.add_argument("--json", action="store_true", help="one JSON array of the stores' reports")
    rev = sub.add_parser("revision", help="write a new revision from the schema's changes (developers)")
    rev.add_argument("store", choices=["global", "zone"])
    rev.add_argument("-m", "--message", required=True, help="what the revision changes")
