"""KV-cache events as vLLM publishes them (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``) and the bounded log that retains them for replay.

Routers build their prefix index from this feed. Sequence numbers are
contiguous from 1 per process; a subscriber that asks for events the log no
longer retains gets them flagged as a gap and must rebuild its view.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    """Full blocks were hashed and entered the prefix cache, in prefix order."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes
    token_ids: tuple[int, ...]
    block_size: int
    medium: str = "gpu"


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks were evicted from the prefix cache."""

    block_hashes: tuple[bytes, ...]
    medium: str = "gpu"


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KvEventPayload = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KvEvent:
    """One event with its sequence number and wall-clock time (epoch seconds)."""

    sequence: int
    timestamp: float
    payload: KvEventPayload


@dataclass(frozen=True)
class KvEventBatch:
    """Events in sequence order; ``gap`` when some before them were dropped."""

    events: tuple[KvEvent, ...]
    gap: bool = False


class KvEventLog:
    """Retains the last ``retention`` events and feeds subscribers.

    Subscribers read by cursor, so a slow one never blocks the engine: if it
    falls behind the retention window it sees a gap instead.
    """

    def __init__(self, retention: int) -> None:
        if retention <= 0:
            raise ValueError("retention must be positive")
        self._events: deque[KvEvent] = deque(maxlen=retention)
        self._last_sequence = 0
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def last_sequence(self) -> int:
        """The sequence number of the newest event, 0 before the first."""
        return self._last_sequence

    def append(self, payload: KvEventPayload) -> KvEvent:
        """Record an event and wake every subscriber."""
        self._last_sequence += 1
        event = KvEvent(self._last_sequence, time.time(), payload)
        self._events.append(event)
        self._wake()
        return event

    def close(self) -> None:
        """End every subscription after it has drained what is retained."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        # Replace the event, so waiters of this round wake and later waiters
        # wait for the next append.
        self._changed.set()
        self._changed = asyncio.Event()

    def read_after(self, after_sequence: int) -> KvEventBatch:
        """Retained events after ``after_sequence``.

        A gap is reported when events after ``after_sequence`` were dropped, or
        when ``after_sequence`` lies beyond the newest event (the subscriber
        followed another process of this pod).
        """
        oldest = self._events[0].sequence if self._events else self._last_sequence + 1
        if after_sequence > self._last_sequence:
            return KvEventBatch(tuple(self._events), gap=True)
        if after_sequence + 1 < oldest:
            return KvEventBatch(tuple(self._events), gap=True)
        skip = after_sequence + 1 - oldest
        return KvEventBatch(tuple(self._events)[skip:], gap=False)

    async def follow(self, after_sequence: int) -> AsyncGenerator[KvEventBatch, None]:
        """Replay, then live batches until :meth:`close`. The first batch is
        always yielded (possibly empty) so a subscriber learns of a gap at once."""
        cursor = max(after_sequence, 0)
        first = True
        while True:
            changed = self._changed
            batch = self.read_after(cursor)
            if batch.events or batch.gap or first:
                yield batch
                first = False
                if batch.events:
                    cursor = batch.events[-1].sequence
                elif batch.gap:
                    cursor = self._last_sequence
            if self._closed:
                return
            await changed.wait()
