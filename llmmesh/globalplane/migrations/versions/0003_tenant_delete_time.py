"""Tenant deletion: when a tenant was deleted (``PolicyService.DeleteTenant``);
null, every existing tenant's value, while it exists.

Revision 0003, after 0002.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from llmmesh.core.sqlstore import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("delete_time", UtcDateTime(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
