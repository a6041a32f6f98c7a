"""The migrations of the global store (Alembic; see :mod:`llmmesh.core.migrations`).

A schema change is a new revision in ``versions/`` (``llmmesh db revision``
writes one from the difference) together with the change to :mod:`llmmesh.globalplane.schema`;
``tests`` check that the head revision builds exactly the current tables.
"""

from __future__ import annotations

from llmmesh.core.migrations import MigrationSet
from llmmesh.globalplane import schema

MIGRATIONS = MigrationSet(
    "global", "llmmesh.globalplane:migrations", schema.metadata, "llmmesh_global_revision"
)
