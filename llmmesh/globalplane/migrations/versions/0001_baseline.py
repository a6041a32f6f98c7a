"""Baseline: the global store as the first release with migrations has it.

Online, a database made before migrations existed is adopted
(:func:`llmmesh.globalplane.migrations.adopt.adopt`): missing tables created, earlier shapes
converted in place, every row kept. Offline (``llmmesh db upgrade --sql``)
the statements that create the baseline in an empty database.

Revision 0001, the first.
"""

from __future__ import annotations

from llmmesh.core.migrations import baseline_upgrade
from llmmesh.globalplane.migrations import baseline
from llmmesh.globalplane.migrations.adopt import adopt

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    baseline_upgrade(baseline.tables, adopt, [(baseline.policy_version, [{"id": 1, "version": 0}])])


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
