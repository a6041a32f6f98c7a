"""Each region's engine pods per model in its kept heartbeat, so every
replica of the global plane counts a model's pods as the region reported
them; null, every existing row's value, until the region's next heartbeat.

Revision 0005, after 0004.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("region_reports", sa.Column("model_pods", sa.JSON(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
