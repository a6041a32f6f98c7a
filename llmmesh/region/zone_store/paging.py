"""AIP-158 page tokens for conversations listed newest first: the position of the last one served."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.region.zone_store.rows import ConversationRow


def encode_position(row: ConversationRow) -> str:
    """The token of the page after ``row``."""
    key = f"{row.created_at.isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")


def decode_position(token: str) -> tuple[datetime, str]:
    """The creation time and id a token's page starts after; INVALID_ARGUMENT when malformed."""
    try:
        created, _, last_id = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8").partition("|")
        moment = datetime.fromisoformat(created)
    except (binascii.Error, UnicodeError, ValueError):
        moment = None
    if moment is None or moment.tzinfo is None or not last_id:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "malformed page_token", metadata={"param": "page_token"}
        )
    return moment, last_id
