"""A global store as a release before migrations left it: no revision
recorded, and none of what revisions after the baseline added."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.globalplane.migrations import baseline


def as_before_migrations(conn: Connection) -> None:
    """Drop the revision table and every column a revision added to a baseline table."""
    conn.exec_driver_sql("DROP TABLE llmmesh_global_revision")
    inspector = sa.inspect(conn)
    for table in baseline.tables.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        for column in inspector.get_columns(table.name):
            if column["name"] not in table.c:
                conn.exec_driver_sql(f"ALTER TABLE {table.name} DROP COLUMN {column['name']}")
