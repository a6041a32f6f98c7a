"""Background work billed: each usage record's purpose ("turn", every
existing record's, or "summary"/"memory") and each tenant's daily cap on
background tokens (0, every existing tenant's value: the region's default).

Revision 0004, after 0003.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("purpose", sa.String(16), server_default="turn", nullable=False))
    op.add_column(
        "tenants", sa.Column("background_tokens_per_day", sa.BigInteger(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
