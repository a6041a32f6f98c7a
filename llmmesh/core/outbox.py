"""Events put by many tasks and sent together by one: the batching of the
session streams (``EngineService.GenerateSession``, ``ChatService.ChatSession``).

Tasks woken by the same event (a decode step reaching every generation of a
batch) all put theirs before the sender, woken by the first of them, runs:
the sender then takes them all as one message.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class Outbox(Generic[T]):
    """A list of pending items and the event that wakes their sender."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._wake = asyncio.Event()

    def put(self, item: T) -> None:
        self._items.append(item)
        self._wake.set()

    @property
    def pending(self) -> bool:
        """Items are waiting to be taken."""
        return bool(self._items)

    def poke(self) -> None:
        """Wake the sender without an item (to look at its own state)."""
        self._wake.set()

    async def take(self) -> list[T]:
        """Wait until woken, then take every pending item (none when only poked)."""
        await self._wake.wait()
        self._wake.clear()
        items, self._items = self._items, []
        return items
