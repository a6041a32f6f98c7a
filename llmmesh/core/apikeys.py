"""API key secrets: how they are made and hashed. Only hashes are stored."""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "sk-llmmesh-"


def new_secret() -> str:
    """A fresh API key secret."""
    return SECRET_PREFIX + secrets.token_urlsafe(24)


def hash_secret(secret: str) -> str:
    """Hex SHA-256 of a secret, as stored and as shipped in policy snapshots."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    """The part of a secret safe to show in listings."""
    return secret[: len(SECRET_PREFIX) + 4]


def bearer_secret(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` value, if any."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
