"""Steady streaming traffic: N streams, each a sequence of turns, until asked to stop.

Stream ``i`` uses key ``i mod len(keys)`` and always the same prompt, so
every whole reply of a stream is the same ``max_tokens`` tokens (the
simulator's output is a pure function of the prompt; a greedy vLLM's
nearly so). A stream starts its next turn as soon as one ends; after a
turn that did not end with ``[DONE]`` it waits a moment first, so a
refusing mesh is not flooded. A stop lets every stream finish the turn it
is in (each bounded by the turn timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from llmmesh.drill.sse_turn import Outcome, TurnRecord, chat_body, stream_turn
from llmmesh.drill.target import TenantKey

RETRY_PAUSE_S = 0.5
"""The wait after a turn that did not end with [DONE]."""
MAX_TURNS_PER_STREAM = 100_000
"""A bound on every stream's loop, far above what any drill runs."""


def prompt_of(stream: int) -> str:
    return f"Drill stream {stream}: tell a long story about the sea, one sentence at a time."


class StreamFleet:
    """Runs the streams and keeps every turn's record."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        keys: Sequence[TenantKey],
        streams: int,
        max_tokens: int,
        turn_timeout_s: float,
    ) -> None:
        self._http = http
        self._keys = list(keys)
        self._streams = streams
        self._max_tokens = max_tokens
        self._turn_timeout_s = turn_timeout_s
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.records: list[TurnRecord] = []
        self.in_flight: dict[int, TurnRecord] = {}

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._stream(i), name=f"drill-stream-{i}") for i in range(self._streams)
        ]

    async def stop(self) -> None:
        """Start no more turns and wait for the running ones to end."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def abandon(self) -> None:
        """Drop the streams now, mid-turn (the drill is being interrupted)."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def counts(self) -> dict[Outcome, int]:
        found = dict.fromkeys(Outcome, 0)
        for record in self.records:
            found[record.outcome] += 1
        return found

    async def _stream(self, stream: int) -> None:
        key = self._keys[stream % len(self._keys)]
        body = chat_body(prompt_of(stream), self._max_tokens)
        for index in range(MAX_TURNS_PER_STREAM):
            if self._stop.is_set():
                return
            record = TurnRecord(stream, index, key.zone, time.monotonic())
            self.in_flight[stream] = record
            await stream_turn(self._http, record, key.secret, body, self._turn_timeout_s)
            del self.in_flight[stream]
            self.records.append(record)
            if record.outcome is not Outcome.DONE:
                try:
                    await asyncio.wait_for(self._stop.wait(), RETRY_PAUSE_S)
                except TimeoutError:
                    pass
