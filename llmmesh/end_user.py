"""The end-user id a tenant may give with a turn (OpenAI's ``user`` /
``safety_identifier``): shared by the region, which takes it from a
request, and billing, which keeps it with the turn's usage.

OpenAI documents it as a stable id of the tenant's own end user, to help
monitor abuse, and recommends a hash of a username or email rather than
the thing itself. The mesh treats it as an opaque id: it is logged with the
turn and billed with its usage, never interpreted.
"""

from __future__ import annotations

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
