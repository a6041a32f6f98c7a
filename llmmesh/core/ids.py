"""Identifiers. Ids that point at stored content name where it lives, so a
follow-up can be routed without a global lookup."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_CONVERSATION = re.compile(r"^conv_([a-z][a-z0-9]{0,15})_([a-z][a-z0-9-]{0,30})_([0-9a-f]{16,32})$")


def new_id(prefix: str, nbytes: int = 12) -> str:
    """A random id such as ``req_3f2a…``."""
    return f"{prefix}_{secrets.token_hex(nbytes)}"


def is_valid_name(name: str) -> bool:
    """Whether a zone or region name is well-formed (``eu``, ``eu-west``)."""
    return bool(_NAME.match(name))


@dataclass(frozen=True)
class ConversationId:
    """A conversation id: ``conv_<zone>_<home region>_<random>``."""

    zone: str
    home_region: str
    token: str

    def __str__(self) -> str:
        return f"conv_{self.zone}_{self.home_region}_{self.token}"

    @classmethod
    def new(cls, zone: str, home_region: str) -> ConversationId:
        return cls(zone, home_region, secrets.token_hex(12))

    @classmethod
    def parse(cls, text: str) -> ConversationId | None:
        """The parsed id, or None when ``text`` is not a conversation id."""
        match = _CONVERSATION.match(text)
        if match is None:
            return None
        return cls(match.group(1), match.group(2), match.group(3))
