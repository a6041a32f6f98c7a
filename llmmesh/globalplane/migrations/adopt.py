"""Revision 0001 online: a global store made before migrations existed, adopted.

:func:`adopt` creates the baseline tables that are missing and converts
the shapes of earlier releases in place, so an empty database and any
earlier release's both end at the baseline (:mod:`.baseline`).

``usage_records`` was keyed by request id alone, so one tenant's request id
could hide another tenant's turn from billing; it is now keyed by (request
id, tenant) and says which records continue a failed-over turn. An older
table is converted in place, keeping every record: PostgreSQL (and
CockroachDB) alter the primary key; SQLite, which cannot, copies the rows
into a new table in one transaction. Later, records named the end user
a turn served (``end_user``): a table without the column gets it, empty
for the records it already holds.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.globalplane.migrations import baseline as schema

log = logging.getLogger(__name__)


def adopt(conn: Connection) -> None:
    """Bring the database on ``conn`` to the baseline, keeping every row."""
    schema.tables.create_all(conn, checkfirst=True)
    upgrade_usage_records(conn)
    upgrade_models(conn)
    upgrade_tenants(conn)
    for table in schema.tables.sorted_tables:
        for index in table.indexes:
            index.create(conn, checkfirst=True)
    insert_new_rows(conn, schema.policy_version, [{"id": 1, "version": 0}])


_TABLE = schema.usage_records.name
_KEY = {"request_id", "tenant_id"}
# Columns added since the first version, each nullable: old records have none.
_ADDED = ("continues_request_id", "end_user")


def usage_records_outdated(conn: Connection) -> bool:
    inspector = sa.inspect(conn)
    if not inspector.has_table(_TABLE):
        return False
    key = set(inspector.get_pk_constraint(_TABLE)["constrained_columns"])
    columns = {c["name"] for c in inspector.get_columns(_TABLE)}
    return key != _KEY or not columns.issuperset(_ADDED)


def upgrade_usage_records(conn: Connection) -> None:
    """Convert an older ``usage_records`` table; a current one is left alone."""
    if not usage_records_outdated(conn):
        return
    log.warning("upgrading %s to the current schema", _TABLE)
    if conn.dialect.name == "sqlite":
        _rebuild(conn)
        return
    inspector = sa.inspect(conn)
    columns = {c["name"] for c in inspector.get_columns(_TABLE)}
    for added in _ADDED:
        if added not in columns:
            kind = schema.usage_records.c[added].type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {_TABLE} ADD COLUMN {added} {kind}")
    if set(inspector.get_pk_constraint(_TABLE)["constrained_columns"]) != _KEY:
        name = inspector.get_pk_constraint(_TABLE)["name"]
        conn.exec_driver_sql(
            f'ALTER TABLE {_TABLE} DROP CONSTRAINT "{name}", ADD PRIMARY KEY (request_id, tenant_id)'
        )
    for index in schema.usage_records.indexes:
        index.create(conn, checkfirst=True)


def _rebuild(conn: Connection) -> None:
    old = f"{_TABLE}_before_upgrade"
    kept = [c["name"] for c in sa.inspect(conn).get_columns(_TABLE)]
    for index in sa.inspect(conn).get_indexes(_TABLE):
        conn.exec_driver_sql(f'DROP INDEX "{index["name"]}"')
    conn.exec_driver_sql(f'ALTER TABLE {_TABLE} RENAME TO "{old}"')
    schema.usage_records.create(conn)
    names = ", ".join(kept)
    conn.exec_driver_sql(f'INSERT INTO {_TABLE} ({names}) SELECT {names} FROM "{old}"')
    conn.exec_driver_sql(f'DROP TABLE "{old}"')


def upgrade_tenants(conn: Connection) -> None:
    """Give an older ``tenants`` table its conversation retention (0: the region's default)."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(schema.tenants.name):
        return
    if "conversation_retention_days" not in {c["name"] for c in inspector.get_columns(schema.tenants.name)}:
        log.warning("adding column conversation_retention_days to %s", schema.tenants.name)
        table = schema.tenants.name
        conn.exec_driver_sql(
            f"ALTER TABLE {table} ADD COLUMN conversation_retention_days INTEGER NOT NULL DEFAULT 0"
        )
    if "memory_enabled" not in {c["name"] for c in sa.inspect(conn).get_columns(schema.tenants.name)}:
        log.warning("adding column memory_enabled to %s", schema.tenants.name)
        conn.exec_driver_sql(
            f"ALTER TABLE {schema.tenants.name} ADD COLUMN memory_enabled BOOLEAN NOT NULL DEFAULT false"
        )


# Columns of ``models`` added since the first version: retirement and canaries.
_MODEL_COLUMNS_ADDED = ("retired", "canary_of", "canary_percent")


def upgrade_models(conn: Connection) -> None:
    """Give an older ``models`` table the columns it lacks (empty: live, no canary)."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(schema.models.name):
        return
    columns = {c["name"] for c in inspector.get_columns(schema.models.name)}
    for added in _MODEL_COLUMNS_ADDED:
        if added not in columns:
            log.warning("adding column %s to %s", added, schema.models.name)
            kind = schema.models.c[added].type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {schema.models.name} ADD COLUMN {added} {kind}")
