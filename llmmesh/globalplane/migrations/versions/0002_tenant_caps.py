"""Tenant caps: the most files, vector stores and facts per end user a
tenant keeps in its zone (0, every existing tenant's value: the region's
default).

Revision 0002, after 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("max_files", "max_vector_stores", "max_memories_per_user"):
        op.add_column("tenants", sa.Column(column, sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
