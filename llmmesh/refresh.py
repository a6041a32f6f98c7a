"""Refreshing a remembered answer before it expires, off the request path.

Planes remember what the global plane told them (keys, routes, models) for a
time to live. Asking again only once an answer has expired puts one global
round trip on the path of the request that finds it expired, and of every
request arriving while that call is out: under steady traffic, a stall of
the tail every TTL. Instead, a request that finds an answer past
``REFRESH_AT`` of its TTL is served from it at once and starts one refresh
in the background (:class:`BackgroundRefresh`); only an answer that has
expired outright, or was never had, is waited for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

log = logging.getLogger(__name__)

REFRESH_AT = 0.5
"""The share of its TTL after which a remembered answer is refreshed ahead."""


def refresh_due(age_s: float, ttl_s: float) -> bool:
    """Whether an answer ``age_s`` old, kept for ``ttl_s``, should be refreshed now."""
    return age_s >= ttl_s * REFRESH_AT


class BackgroundRefresh:
    """Runs refreshes in the background, at most one per key at a time.

    A refresh stores its own answer (or drops the one it found wrong); its
    failure is logged, never raised: the remembered answer stands until it
    expires, and the request that then finds it expired asks in the open.
    Not thread-safe: one event loop.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._running: dict[Hashable, asyncio.Task[Any]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def start(self, key: Hashable, refresh: Callable[[], Awaitable[object]]) -> bool:
        """Start ``refresh`` for ``key`` unless one is running; True when started."""
        running = self._running.get(key)
        if running is not None and not running.done():
            return False
        task = asyncio.ensure_future(refresh())
        self._running[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return True

    def _finished(self, key: Hashable, task: asyncio.Task[Any]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.debug("%s: a background refresh failed: %s", self._name, error)

    async def close(self) -> None:
        """Cancel the refreshes still running and wait for them."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
