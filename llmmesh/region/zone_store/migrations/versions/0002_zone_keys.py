"""Zone keys: a zone's secrets, kept in its store only; the first is the
key of its end users' pseudonyms (made by the first region that needs it).

Revision 0002, after 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from llmmesh.core.sqlstore import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zone_keys",
        sa.Column("zone", sa.String(length=16), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("home_region", sa.String(length=64), nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("zone", "purpose"),
    )


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
