"""A zone's secrets, in its store: made once, by whichever region of the
zone needs one first, and read by every other region of the zone.

Get-or-create is one transaction: ``INSERT … ON CONFLICT DO NOTHING`` of a
fresh secret, then a read of the row that won. Two regions starting at
once each offer a secret of their own; the primary key lets one in and the
other waits for its outcome, so both read the same secret.
"""

from __future__ import annotations

import secrets
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from llmmesh.core.sqlstore import insert_new_rows
from llmmesh.region.zone_store import schema

SECRET_BYTES = 32
END_USER_PSEUDONYM = "end_user_pseudonym"
"""The purpose of the key end users' pseudonyms are computed with."""


def zone_key(conn: Connection, zone: str, purpose: str, region: str, now: datetime) -> bytes:
    """The secret of ``zone`` for ``purpose``, made (and homed in ``region``) if the zone has none."""
    k = schema.zone_keys
    offered = {
        "zone": zone,
        "purpose": purpose,
        "home_region": region,
        "secret": secrets.token_bytes(SECRET_BYTES),
        "created_at": now,
    }
    insert_new_rows(conn, k, [offered])
    secret = conn.execute(sa.select(k.c.secret).where(k.c.zone == zone, k.c.purpose == purpose)).scalar_one()
    return bytes(secret)
