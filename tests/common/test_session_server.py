"""The session stream ends only after every event of its requests went out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from llmmesh.core.errors import Internal, MeshError, Reason
from llmmesh.core.session_server import SessionServer


class _Server(SessionServer[str, str, list[str]]):
    """Each request puts "<id>:first", waits for ``go``, then puts "<id>:last"."""

    kind = "request"
    internal = Internal(Reason.INTERNAL, "failed")

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    def request_id(self, start: str) -> str:
        return start

    async def run(self, request_id: str, start: str) -> None:
        self.outbox.put(f"{request_id}:first")
        await self.go.wait()
        self.outbox.put(f"{request_id}:last")

    async def cancel(self, request_id: str, reason: str) -> None:
        raise AssertionError("no cancel is sent")

    def error_event(self, request_id: str, error: MeshError) -> str:
        return f"{request_id}:error"

    def response(self, events: list[str]) -> list[str]:
        return events


async def _one_start_then_half_close() -> AsyncIterator[Any]:
    yield SimpleNamespace(WhichOneof=lambda _: "start", start="a")


@pytest.mark.asyncio
async def test_a_request_ending_while_the_message_before_is_sent_still_gets_its_last_events_out() -> None:
    server = _Server()
    stream = server.serve(_one_start_then_half_close())
    assert await anext(stream) == ["a:first"]
    # The sender is suspended in its yield (the message being sent) while
    # the request puts its last event and ends, and the client has half-closed.
    server.go.set()
    async with asyncio.timeout(5):
        while server._running:
            await asyncio.sleep(0)
    rest = [message async for message in stream]
    assert rest == [["a:last"]]
