"""Refreshing a remembered answer before it expires, off the request path.

Planes remember what the global plane told them (keys, routes, models) for a
time to live. Asking again only once an answer has expired puts one global
round trip on the path of the request that finds it expired, and of every
request arriving while that call is out: under steady traffic, a stall of
the tail every TTL. Instead, a request that finds an answer past
``REFRESH_AT`` of its TTL is served from it at once and starts one refresh
in the background; only an answer that has expired outright, or was never
had, is waited for. :class:`SingleFlight` runs those calls, one per key at a
time, for the requests that wait and for the refreshes nobody waits for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

REFRESH_AT = 0.5
"""The share of its TTL after which a remembered answer is refreshed ahead."""


def refresh_due(age_s: float, ttl_s: float) -> bool:
    """Whether an answer ``age_s`` old, kept for ``ttl_s``, should be refreshed now."""
    return age_s >= ttl_s * REFRESH_AT


class SingleFlight(Generic[T]):
    """Calls in their own tasks, at most one per key at a time.

    A call stores its own answer (or drops the one it found wrong). Callers
    that need the answer await the task (shielded, so one that gives up does
    not cancel it for the others); a failure nobody awaits is logged, never
    raised: the remembered answer stands until it expires, and the request
    that then finds it expired asks in the open. Not thread-safe: one event
    loop.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._running: dict[Hashable, asyncio.Task[T]] = {}

    def __contains__(self, key: Hashable) -> bool:
        """Whether a call for ``key`` is running."""
        task = self._running.get(key)
        return task is not None and not task.done()

    def start(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """The running call for ``key``, or ``call`` started now."""
        task = self._running.get(key)
        if task is None or task.done():
            task = asyncio.ensure_future(call())
            self._running[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return task

    def _finished(self, key: Hashable, task: asyncio.Task[T]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if task.cancelled():
            return
        error = task.exception()  # retrieved, so a call nobody awaits is not reported as lost
        if error is not None:
            log.debug("%s: a call failed: %s", self._name, error)

    async def close(self) -> None:
        """Cancel the calls still running and wait for them."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
