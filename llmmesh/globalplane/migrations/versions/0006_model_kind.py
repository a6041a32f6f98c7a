"""What each model is for, "chat" or "embedding"; null, every existing
row's value, reads as chat. The global plane gives the embedding model it
starts with its kind on its next start (``ModelCatalog.add_missing``).

Revision 0006, after 0005.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("kind", sa.String(16), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("migrations go forward only: restore a backup to go back")
