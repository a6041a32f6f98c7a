"""Schema migrations of a store, with Alembic: upgrade, revision, drift, and the SQL they would run.

Each store (the global store, a zone store) has a :class:`MigrationSet`:
its Alembic script folder inside the package, the metadata of its current
tables and a version table of its own (one database may hold several
stores' tables; each records its own revision). The scripts' ``env.py`` is
:func:`run_env`, so every set runs the same way:

- **online**, on a connection the caller holds in a transaction
  (:func:`upgrade`): a store's first revision adopts a database written
  before migrations existed, creating what is missing and converting old
  shapes in place, so an empty database and an earlier release's both
  reach the head by the same path;
- **offline** (:func:`upgrade_sql`): the statements for a dialect, printed
  instead of run (``llmmesh db upgrade --sql``), with no database at all.

:func:`drift` compares a database with the metadata (tables, columns,
indexes, keys of this set only) the way Alembic's autogenerate does; a
store at its head revision with no drift is what this release expects.

A plane opening its store (:meth:`llmmesh.core.sqlstore.SqlStore.migrate`)
upgrades SQLite and PostgreSQL itself; on PostgreSQL an advisory lock
makes regions opening one zone store at once take turns. CockroachDB is
upgraded by the operator (``llmmesh db upgrade``, a Job in the chart),
since it also sets the tables' locality; a plane there only checks the
revision and refuses to start on an older one, naming the command.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

log = logging.getLogger(__name__)
# Alembic says at INFO what it sets up on every run; an upgrade that runs is logged here.
logging.getLogger("alembic").setLevel(logging.WARNING)


@dataclass(frozen=True)
class MigrationSet:
    """One store's migrations: ``name`` (``global``, ``zone``), the script
    folder as ``package:folder``, the current tables' ``metadata`` and the
    ``version_table`` that records the database's revision."""

    name: str
    script_location: str
    metadata: sa.MetaData
    version_table: str

    @property
    def lock_key(self) -> int:
        """The PostgreSQL advisory lock key of this set's upgrades."""
        return zlib.crc32(f"llmmesh-migrations-{self.name}".encode())

    def config(self, **attributes: Any) -> Config:
        cfg = Config(output_buffer=attributes.pop("output_buffer", None))
        cfg.set_main_option("script_location", self.script_location)
        cfg.attributes["migration_set"] = self
        cfg.attributes.update(attributes)
        return cfg

    def head(self) -> str:
        """The newest revision of the scripts."""
        head = ScriptDirectory.from_config(self.config()).get_current_head()
        assert head is not None, f"{self.name} migrations have no revision"
        return head

    def revisions(self) -> list[str]:
        """Every revision, oldest first."""
        scripts = ScriptDirectory.from_config(self.config())
        return [s.revision for s in reversed(list(scripts.walk_revisions()))]


class StoreNotMigrated(ValueError):
    """A store whose revision is not the head this release needs: a plane
    cannot start on it (``llmmesh <plane>`` prints the message and exits 2)."""


def _include(migration_set: MigrationSet) -> Any:
    tables = set(migration_set.metadata.tables)

    def include(obj: Any, name: str | None, kind: str, reflected: bool, _compare_to: Any) -> bool:
        if kind == "table":
            return name in tables
        table = getattr(obj, "table", None)
        return table is None or table.name in tables

    return include


def _configure(context: Any, migration_set: MigrationSet, **options: Any) -> None:
    context.configure(
        target_metadata=migration_set.metadata,
        version_table=migration_set.version_table,
        include_object=_include(migration_set),
        transaction_per_migration=False,
        **options,
    )


def run_env() -> None:
    """The body of every script folder's ``env.py``, run by Alembic."""
    from alembic import context

    migration_set: MigrationSet = context.config.attributes["migration_set"]
    if context.is_offline_mode():
        _configure(
            context, migration_set, dialect_name=context.config.attributes["dialect"], literal_binds=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    _configure(context, migration_set, connection=context.config.attributes["connection"])
    with context.begin_transaction():
        context.run_migrations()


def baseline_upgrade(
    tables: sa.MetaData,
    adopt: Callable[[Connection], None],
    rows: Sequence[tuple[sa.Table, list[dict[str, Any]]]] = (),
) -> None:
    """The body of a store's first revision: online, ``adopt`` the database
    (create what is missing, convert what an earlier release left, keep every
    row); offline, the statements that create ``tables`` and insert ``rows``
    in an empty database."""
    from alembic import context, op

    if not context.is_offline_mode():
        adopt(op.get_bind())
        return
    for table in tables.sorted_tables:
        op.execute(CreateTable(table))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            op.execute(CreateIndex(index))
    for table, values in rows:
        op.bulk_insert(table, values)


def revision(conn: Connection, migration_set: MigrationSet) -> str | None:
    """The database's revision of ``migration_set``; None before the first."""
    context = MigrationContext.configure(conn, opts={"version_table": migration_set.version_table})
    return context.get_current_revision()


def upgrade(conn: Connection, migration_set: MigrationSet, target: str = "head") -> None:
    """Run the migrations up to ``target`` on ``conn`` (the caller commits);
    on PostgreSQL under a transaction-scoped advisory lock, so concurrent
    upgrades of one database run one after another."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(migration_set.lock_key)))
    before = revision(conn, migration_set)
    command.upgrade(migration_set.config(connection=conn), target)
    after = revision(conn, migration_set)
    if after != before:
        log.info("upgraded the %s store from revision %s to %s", migration_set.name, before or "none", after)


def upgrade_sql(migration_set: MigrationSet, dialect: str, start: str | None = None) -> str:
    """The SQL that upgrading from ``start`` (None: an empty database) to the
    head would run on ``dialect``, as Alembic's offline mode prints it."""
    out = io.StringIO()
    cfg = migration_set.config(dialect=dialect, output_buffer=out)
    command.upgrade(cfg, f"{start}:head" if start else "head", sql=True)
    return out.getvalue()


def drift(conn: Connection, migration_set: MigrationSet) -> list[str]:
    """How the database differs from the current tables of ``migration_set``
    (missing or extra tables, columns, indexes and constraints), one line each."""
    context = MigrationContext.configure(
        conn,
        opts={
            "version_table": migration_set.version_table,
            "include_object": _include(migration_set),
            "compare_type": False,
            "compare_server_default": False,
        },
    )
    return [_describe(diff) for diff in _flatten(compare_metadata(context, migration_set.metadata))]


def _flatten(diffs: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for diff in diffs:
        if isinstance(diff, list):
            flat.extend(diff)
        else:
            flat.append(diff)
    return flat


def _describe(diff: Any) -> str:
    kind, *rest = diff
    words = {
        "add_table": "table missing",
        "remove_table": "table not in this release",
        "add_column": "column missing",
        "remove_column": "column not in this release",
        "add_index": "index missing",
        "remove_index": "index not in this release",
        "add_constraint": "constraint missing",
        "remove_constraint": "constraint not in this release",
        "modify_nullable": "nullability differs",
    }
    subject = rest[-1] if kind in ("add_column", "remove_column") else rest[0]
    if kind in ("add_column", "remove_column"):
        name = f"{rest[1]}.{subject.name}"
    elif kind.startswith("modify_"):
        name = f"{rest[2]}.{rest[3]}"
    else:
        name = getattr(subject, "name", None) or str(subject)
        table = getattr(subject, "table", None)
        if table is not None:
            name = f"{table.name}: {name}"
    return f"{words.get(kind, kind)}: {name}"
