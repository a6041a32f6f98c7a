"""An asyncio event loop on a virtual clock: time stands still while any
task can run, and jumps to the next timer when every task is waiting.

``loop.time()`` (so ``asyncio.sleep``, ``asyncio.timeout``, ``call_later``)
reads the virtual clock, which starts at 0.0 and only ever advances to the
deadline of the earliest timer, by the same float arithmetic on every
machine: a program that waits only on timers and on other tasks runs the
same way, to the digit, wherever and however fast it runs. The wall clock
(``time.monotonic``, ``time.time``) is not virtual; code on the measured
path must take its clock from the loop.

Sockets and file descriptors still work (they are polled without waiting),
but nothing that waits on them advances the clock: the loop is for
programs with no I/O on the path being timed. When every task waits and no
timer is set, nothing could ever wake them unless another thread calls in,
so the loop waits for that up to ``stall_s`` of wall time, then raises
:class:`VirtualClockStalled`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualClockStalled(RuntimeError):
    """Every task waits on something no timer or task will ever deliver."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait for a timer moves the clock instead."""

    def __init__(self, loop: VirtualClockLoop, stall_s: float) -> None:
        super().__init__()
        self._loop = loop
        self._stall_s = stall_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            ready = super().select(self._stall_s)
            if not ready:
                raise VirtualClockStalled(
                    "every task waits and no timer is set: nothing can wake them on a virtual clock"
                )
            return ready
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self, stall_s: float = 5.0) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self, stall_s))
        # The wall clock's resolution varies by machine; timers due within it
        # count as due, so a fixed one keeps their order the same everywhere.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (never back)."""
        if seconds > 0:
            self._now += seconds


def run_virtual(main: Coroutine[Any, Any, T], stall_s: float = 5.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualClockLoop`,
    as :func:`asyncio.run` does on a real-time loop."""
    with asyncio.Runner(loop_factory=lambda: VirtualClockLoop(stall_s)) as runner:
        return runner.run(main)
