"""Baseline: a zone store as the first release with migrations has it.

Online, a database made before migrations existed is adopted
(:func:`llmmesh.region.zone_store.migrations.adopt.adopt`): missing tables created, earlier shapes
converted in place, every row kept. Offline (``llmmesh db upgrade --sql``)
the statements that create the baseline in an empty database.

Revision 0001, the first.
"""

from __future__ import annotations

from llmmesh.core.migrations import baseline_upgrade
from llmmesh.region.zone_store.migrations import baseline
from llmmesh.region.zone_store.migrations.adopt import adopt

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    baseline_upgrade(baseline.tables, adopt)


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
