"""Revision 0001 online: a zone store made before migrations existed, adopted.

:func:`adopt` creates the baseline tables that are missing, adds the
columns an earlier release's tables lack (each has a server default) and
converts their keys in place, so an empty database and any earlier
release's both end at the baseline (:mod:`.baseline`).

Request ids were one namespace across a zone's tenants: ``turn_starts`` and
``usage_outbox`` were keyed by the request id alone and a message was unique
per request id and role, so one tenant could take ids another would use.
They are now keyed by (tenant, request id). Later, tool messages came: a
turn may store one per tool call it answers, so a message is unique per
tenant, request id, role and the tool call it answers (``tool_call_id``,
empty on other roles; the column itself is added with its default before
this runs, as every new column is). An older store is converted in
place, keeping every row: PostgreSQL and CockroachDB alter the keys; SQLite,
which cannot, copies each outdated table's rows into a new one, all in one
transaction.

Conversations were lists in ``seq`` order before they were trees: when the
messages' ``parent_id`` column is added, each message is linked to the one
before it (:func:`link_linear_history`), so every old conversation is one
branch.

Several regions may open one zone store at once: on PostgreSQL the first to
find it outdated locks the tables and the others find it current once they
get them.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.region.zone_store.migrations import baseline as schema

log = logging.getLogger(__name__)

_KEY = {"tenant_id", "request_id"}
_KEYED = (schema.usage_outbox, schema.turn_starts)
_M = schema.messages
_MESSAGE_UNIQUE = "uq_messages_tenant_request_role_call"
# Unique constraints of earlier versions, the oldest first.
_OLD_MESSAGE_UNIQUES = ("uq_messages_request_role", "uq_messages_tenant_request_role")
_OLD_TURN_INDEX = "ix_turn_starts_continues"
ZONE_TABLES = tuple(schema.tables.sorted_tables)


def adopt(conn: Connection) -> None:
    """Bring the database on ``conn`` to the baseline, keeping every row."""
    schema.tables.create_all(conn, checkfirst=True)
    add_missing_columns(conn)
    upgrade_request_keys(conn)
    create_missing_indexes(conn)


def add_missing_columns(conn: Connection) -> None:
    """Add the columns an earlier release's tables lack, with their server
    defaults; messages, once a list, become a chain of parents when
    ``parent_id`` comes (:func:`link_linear_history`)."""
    inspector = sa.inspect(conn)
    for table in ZONE_TABLES:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            if column.server_default is None:
                raise RuntimeError(f"zone store table {table.name} lacks column {column.name}")
            kind = column.type.compile(dialect=conn.dialect)
            default = column.server_default.arg  # type: ignore[attr-defined]
            log.warning("adding column %s to %s", column.name, table.name)
            conn.execute(
                sa.text(
                    f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind} NOT NULL DEFAULT '{default}'"
                )
            )
            if column is _M.c.parent_id:
                link_linear_history(conn)


def outdated_tables(conn: Connection) -> list[sa.Table]:
    """The zone tables that exist with request ids not yet keyed by tenant
    (or, for messages, by tenant and the tool call answered)."""
    inspector = sa.inspect(conn)
    found = [
        table
        for table in _KEYED
        if inspector.has_table(table.name)
        and set(inspector.get_pk_constraint(table.name)["constrained_columns"]) != _KEY
    ]
    if inspector.has_table(_M.name):
        uniques = {frozenset(u["column_names"]) for u in inspector.get_unique_constraints(_M.name)}
        if frozenset(c.name for c in _message_unique().columns) not in uniques:
            found.append(_M)
    return found


def upgrade_request_keys(conn: Connection) -> None:
    """Key an older store's request ids by tenant (and its messages by the
    tool call they answer); a current store is left alone."""
    if not outdated_tables(conn):
        return
    if conn.dialect.name == "postgresql":
        names = ", ".join(t.name for t in (*_KEYED, _M))
        conn.exec_driver_sql(f"LOCK TABLE {names} IN ACCESS EXCLUSIVE MODE")
    tables = outdated_tables(conn)  # again: another region may have upgraded meanwhile
    for table in tables:
        log.warning("upgrading zone store table %s to the current keys", table.name)
        if conn.dialect.name == "sqlite":
            _rebuild(conn, table)
        elif table is _M:
            _rekey_messages(conn)
        else:
            _rekey(conn, table)


def _message_unique() -> sa.UniqueConstraint:
    return next(c for c in _M.constraints if isinstance(c, sa.UniqueConstraint) and c.name == _MESSAGE_UNIQUE)


def _rekey(conn: Connection, table: sa.Table) -> None:
    """Make (tenant, request id) the primary key, in one statement: CockroachDB
    then keeps no unique index of the old key behind."""
    name = sa.inspect(conn).get_pk_constraint(table.name)["name"]
    columns = ", ".join(c.name for c in table.primary_key.columns)
    conn.exec_driver_sql(f'ALTER TABLE {table.name} DROP CONSTRAINT "{name}", ADD PRIMARY KEY ({columns})')
    if table is schema.turn_starts:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {_OLD_TURN_INDEX}")
    for index in table.indexes:
        index.create(conn, checkfirst=True)


def _rekey_messages(conn: Connection) -> None:
    for old in _OLD_MESSAGE_UNIQUES:
        if conn.dialect.name == "cockroachdb":
            # CockroachDB drops a table's UNIQUE constraint through its index.
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {_M.name}@{old} CASCADE")
        else:
            conn.exec_driver_sql(f"ALTER TABLE {_M.name} DROP CONSTRAINT IF EXISTS {old}")
    conn.execute(sa.schema.AddConstraint(_message_unique()))


def _rebuild(conn: Connection, table: sa.Table) -> None:
    """SQLite: the table made anew under its current keys, with every row of the old one."""
    old = f"{table.name}_before_upgrade"
    inspector = sa.inspect(conn)
    kept = [c["name"] for c in inspector.get_columns(table.name)]
    # Index names are the database's, not the table's: free them for the new table.
    for index in inspector.get_indexes(table.name):
        conn.exec_driver_sql(f'DROP INDEX "{index["name"]}"')
    conn.exec_driver_sql(f'ALTER TABLE {table.name} RENAME TO "{old}"')
    table.create(conn)
    names = ", ".join(f'"{name}"' for name in kept)
    conn.exec_driver_sql(f'INSERT INTO {table.name} ({names}) SELECT {names} FROM "{old}"')
    conn.exec_driver_sql(f'DROP TABLE "{old}"')


def link_linear_history(conn: Connection) -> None:
    """Make each message without a parent follow the conversation's message
    numbered before it: a list become a one-branch tree. Run once, when the
    ``parent_id`` column is added (afterwards an empty parent is a first message)."""
    before = _M.alias("before")
    previous = (
        sa.select(before.c.id)
        .where(before.c.conversation_id == _M.c.conversation_id, before.c.seq < _M.c.seq)
        .order_by(before.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(sa.update(_M).where(_M.c.parent_id == "").values(parent_id=sa.func.coalesce(previous, "")))


def create_missing_indexes(conn: Connection) -> None:
    """Create the zone tables' indexes an older store lacks."""
    for table in ZONE_TABLES:
        for index in table.indexes:
            index.create(conn, checkfirst=True)
