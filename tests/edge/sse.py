"""Reading the edge's server-sent events as a client does, for the edge tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """One SSE event: its ``id:`` (None when it has none) and its ``data:``."""

    id: int | None
    data: str

    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value


def parse_events(text: str) -> list[Event]:
    """The events of a whole SSE body."""
    events = []
    for block in text.strip().split("\n\n"):
        event_id, data = None, ""
        for line in block.splitlines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                data = line[6:]
        events.append(Event(event_id, data))
    return events


async def events_of(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    """The events of a stream of lines, as they complete."""
    event_id: int | None = None
    data: list[str] = []
    async for line in lines:
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            data.append(line[6:])
        elif not line and data:
            yield Event(event_id, "".join(data))
            event_id, data = None, []
