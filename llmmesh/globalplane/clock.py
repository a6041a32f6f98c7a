"""Time as the global plane sees it: timezone-aware UTC, injectable for tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware."""


def utc_now() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)
