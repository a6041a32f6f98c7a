"""The global store: the control plane's tables on :class:`llmmesh.core.sqlstore.SqlStore`.

SQLite (embedded), PostgreSQL or CockroachDB, run the way every plane's store
is (see :mod:`llmmesh.core.sqlstore`: a sync engine on worker threads, whole
transactions retried on serialization failures). In a multi-region
CockroachDB the control-plane tables are ``GLOBAL``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from sqlalchemy.engine import Dialect

from llmmesh.core.home import mesh_home
from llmmesh.core.sqlstore import SqlStore, create_store_engine, insert_new_rows
from llmmesh.globalplane import schema
from llmmesh.globalplane.migrations import MIGRATIONS

__all__ = [
    "GlobalStore",
    "create_store_engine",
    "default_database_url",
    "global_locality_statements",
    "insert_new_rows",
]


def default_database_url(environ: Mapping[str, str] | None = None) -> str:
    """``sqlite:///$LLMMESH_HOME/global.db`` (``~/.llmmesh`` when unset), like ``llmmesh up``'s home."""
    return f"sqlite:///{mesh_home(environ) / 'global.db'}"


def global_locality_statements(dialect: Dialect | None = None) -> list[str]:
    """``ALTER TABLE … SET LOCALITY GLOBAL`` for each control-plane table.

    In a multi-region CockroachDB, GLOBAL tables serve fast, consistent reads
    in every region at the cost of slower writes: right for tenants, keys,
    models and prices, which every region reads on each request and which
    change rarely. Usage tables keep the database's default locality.
    """
    if dialect is None:
        from sqlalchemy_cockroachdb.psycopg import CockroachDBDialect_psycopg

        dialect = CockroachDBDialect_psycopg()
    quote = dialect.identifier_preparer.format_table
    return [f"ALTER TABLE {quote(table)} SET LOCALITY GLOBAL" for table in schema.CONTROL_PLANE_TABLES]


class GlobalStore(SqlStore):
    """The database behind the tenant book, model catalog and usage ledger."""

    store_label = "global"

    @classmethod
    async def open(cls, url: str) -> GlobalStore:
        """Connect to ``url`` and bring it to this release's schema (see :meth:`create_schema`)."""
        store = cls(create_store_engine(url))
        await asyncio.to_thread(store.create_schema)
        return store

    def create_schema(self) -> None:
        """Bring the database to this release's schema (:mod:`llmmesh.globalplane.migrations`)."""
        self.migrate(MIGRATIONS)
