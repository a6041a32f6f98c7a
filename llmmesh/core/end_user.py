"""The end-user id a tenant may give with a turn (OpenAI's ``user`` /
``safety_identifier``): shared by the region, which takes it from a
request, and billing, which keeps it with the turn's usage.

OpenAI documents it as a stable id of the tenant's own end user, to help
monitor abuse, and recommends a hash of a username or email rather than
the thing itself. The mesh treats it as an opaque id, never interpreted:
inside the tenant's zone it is kept as given (zone-store rows, the region's
log of the turn); outside, billing included, only its pseudonym
(:func:`end_user_pseudonym`) is, keyed by a secret of the zone that never
leaves the zone store, so no plane outside the zone can compute or reverse it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

from llmmesh.core.errors import InvalidArgument, Reason

MAX_END_USER_CHARS = 256
"""The longest id kept (the billing column's width). OpenAI's own limit is
not stated for ``user``; 256 holds any hash or UUID with room to spare."""


def require_end_user(end_user: str, param: str = "user") -> str:
    """``end_user`` if it can be kept: at most :data:`MAX_END_USER_CHARS`
    characters, all printable (no control characters or line breaks, which
    would forge log lines). Empty means none was given. INVALID_ARGUMENT
    naming ``param`` otherwise."""
    if len(end_user) > MAX_END_USER_CHARS:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"the end-user id has {len(end_user)} characters; at most {MAX_END_USER_CHARS} are allowed",
            metadata={"param": param},
        )
    if not end_user.isprintable():
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "the end-user id must be printable text (no control characters or line breaks)",
            metadata={"param": param},
        )
    return end_user


PSEUDONYM_PREFIX = "eup1_"
"""What begins every end-user pseudonym (version 1 of the scheme)."""
_PSEUDONYM = re.compile(re.escape(PSEUDONYM_PREFIX) + "[a-z2-7]{26}")


def end_user_pseudonym(zone_secret: bytes, tenant_id: str, end_user: str) -> str:
    """The pseudonym of ``tenant_id``'s ``end_user`` under ``zone_secret``:
    :data:`PSEUDONYM_PREFIX` then the first 128 bits of
    HMAC-SHA256(zone_secret, tenant_id NUL end_user) in lowercase base32.
    The tenant is in the message, so two tenants' end users of one id are
    two pseudonyms. Empty for no end user."""
    if not end_user:
        return ""
    message = f"{tenant_id}\0{end_user}".encode()
    digest = hmac.new(zone_secret, message, hashlib.sha256).digest()[:16]
    return PSEUDONYM_PREFIX + base64.b32encode(digest).decode().rstrip("=").lower()


def is_end_user_pseudonym(text: str) -> bool:
    """Whether ``text`` has the shape of :func:`end_user_pseudonym`'s output."""
    return _PSEUDONYM.fullmatch(text) is not None


def require_end_user_pseudonym(end_user: str, param: str = "end_user") -> str:
    """``end_user`` if it is empty or an end-user pseudonym; INVALID_ARGUMENT
    (``END_USER_NOT_PSEUDONYMOUS``) naming ``param`` otherwise, for outside
    its zone an end user is known only by its pseudonym."""
    if end_user and not is_end_user_pseudonym(end_user):
        raise InvalidArgument(
            Reason.END_USER_NOT_PSEUDONYMOUS,
            f"{param} must be an end user's pseudonym ({PSEUDONYM_PREFIX} and 26 base32 characters), "
            "not the tenant's id of the end user: end users are pseudonymous outside their zone, and "
            "only a region of the tenant's zone computes the pseudonym (EndUserService."
            "PseudonymizeEndUser, which `llmmesh admin usage TENANT --end-user ID` asks)",
            metadata={"param": param},
        )
    return end_user
