"""The migrations of a zone store (Alembic; see :mod:`llmmesh.core.migrations`).

A schema change is a new revision in ``versions/`` (``llmmesh db revision``
writes one from the difference) together with the change to :mod:`llmmesh.region.zone_store.schema`;
``tests`` check that the head revision builds exactly the current tables.
"""

from __future__ import annotations

from llmmesh.core.migrations import MigrationSet
from llmmesh.region.zone_store import schema

MIGRATIONS = MigrationSet(
    "zone", "llmmesh.region.zone_store:migrations", schema.metadata, "llmmesh_zone_revision"
)
