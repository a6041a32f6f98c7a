"""A clock tests move by hand, so no test depends on wall-clock time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """Returns ``now`` until told to advance."""

    def __init__(self, start: datetime = datetime(2031, 5, 17, 12, 0, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)
