"""Not waiting on a global plane known to be down.

Planes keep answers of the global plane (keys, routes, models, usage totals)
and use them, for a bounded time, while it is unreachable. Without more, each
caller would still wait out its own deadline before falling back, so a
partitioned global plane (no connection reset, just silence) would stall
every turn by that deadline. :class:`OutageGate` remembers the outage: while
it lasts, a caller that holds a usable stale answer uses it at once, and one
caller at a time, every ``probe_s``, asks again (with a short deadline) to
notice the global plane's return.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PROBE_TIMEOUT_S = 1.0
"""The deadline of a call made while a stale answer could stand in for it."""


class OutageGate:
    """Whether to ask the global plane now; see the module docstring."""

    def __init__(self, probe_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if probe_s <= 0:
            raise ValueError("probe_s must be positive")
        self._probe_s = probe_s
        self._clock = clock
        self._down = False
        self._next_probe = 0.0

    @property
    def down(self) -> bool:
        """The last call failed as unreachable."""
        return self._down

    def skip(self) -> bool:
        """True: the global plane is down and another caller probes it; use
        the stale answer. False: ask (the caller becomes the prober when down)."""
        if not self._down:
            return False
        now = self._clock()
        if now < self._next_probe:
            return True
        self._next_probe = now + self._probe_s
        return False

    def failed(self) -> None:
        """A call found the global plane unreachable."""
        if not self._down:
            self._down = True
            self._next_probe = self._clock() + self._probe_s

    def answered(self) -> None:
        """A call got an answer: the outage, if any, is over."""
        self._down = False
