"""Tenant tiers, zones and other small vocabulary shared by the global plane's books."""

from __future__ import annotations

import re
from enum import StrEnum

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.ids import is_valid_name

# A zone is embedded in conversation ids (``conv_<zone>_<region>_…``), so it
# follows that grammar: no hyphen, which also keeps it apart from region
# names such as "eu-west".
_PLAIN_ZONE = re.compile(r"^[a-z][a-z0-9]{0,15}$")


class TenantTier(StrEnum):
    """A tenant's service tier."""

    FREE = "free"
    PRO = "pro"
    ENTERPRISE = "enterprise"

    @classmethod
    def parse(cls, text: str) -> TenantTier:
        """The tier named ``text`` (case-insensitive); INVALID_ARGUMENT otherwise."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"unknown tier {text!r}; expected one of {', '.join(t.value for t in cls)}",
                metadata={"param": "tier"},
            ) from None


def is_plain_zone(zone: str) -> bool:
    """Whether ``zone`` names a zone ("eu", "us"), not a region ("eu-west")."""
    return is_valid_name(zone) and bool(_PLAIN_ZONE.match(zone))


def require_zone(zone: str, param: str = "zone") -> str:
    """``zone`` if it is a plain zone name; INVALID_ARGUMENT otherwise."""
    if not is_plain_zone(zone):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{zone!r} is not a zone name (lowercase letters and digits, like 'eu' or 'us')",
            metadata={"param": param},
        )
    return zone
