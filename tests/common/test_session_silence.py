"""A session request's silence watch: the reader of a request whose server
sends it nothing for the limit stops with the watch's error, on a virtual
clock (the times below are exact)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmmesh.bench.virtual_clock import run_virtual
from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.session_client import SessionClient, SessionRequest, SilenceWatch


class _Call:
    """A session stream whose server's messages the test sends."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[list[tuple[str, str]]] = asyncio.Queue()
        self.written: list[Any] = []

    async def _messages(self) -> AsyncIterator[list[tuple[str, str]]]:
        while True:
            yield await self.messages.get()

    def __aiter__(self) -> AsyncIterator[list[tuple[str, str]]]:
        return self._messages()

    async def write(self, message: Any) -> None:
        self.written.append(message)

    def cancel(self) -> None:
        pass


def _session(call: _Call) -> SessionClient[Any, str]:
    return SessionClient(
        "server",
        lambda: call,
        lambda message: message,
        lambda event: event == "end",
        lambda request_id, reason: ("cancel", request_id),
        lambda cause: Unavailable(Reason.REGION_UNAVAILABLE, cause),
    )


def _stalled(limit_s: float) -> Unavailable:
    return Unavailable(Reason.ENGINE_FAILED, f"nothing for {limit_s:g} s")


async def _read_until_stalled(request: SessionRequest[Any, str]) -> tuple[list[str], float, str]:
    """The events read, when the reading stopped and why."""
    loop = asyncio.get_running_loop()
    events: list[str] = []
    try:
        while (event := await request.read()) is not None:
            events.append(event)
    except Unavailable as err:
        return events, loop.time(), err.message
    return events, loop.time(), "ended"


async def _send_every(call: _Call, gap_s: float, events: list[str]) -> None:
    for event in events:
        await asyncio.sleep(gap_s)
        call.messages.put_nowait([("r1", event)])


def test_a_silent_server_stops_the_reader_after_the_limit_and_the_request_is_stopped_on_the_server() -> None:
    async def scenario() -> tuple[list[str], float, str, list[Any]]:
        call = _Call()
        session = _session(call)
        request = await session.start("r1", ("start", "r1"))
        watch = SilenceWatch(request, 2.0, _stalled)
        sending = asyncio.create_task(_send_every(call, 0.5, ["a", "b", "c"]))
        events, at, why = await _read_until_stalled(request)
        watch.cancel()
        await sending
        # The request did not end: abandoning it has the server stop it.
        request.abandon("stalled")
        await asyncio.sleep(0)
        await session.close()
        return events, at, why, call.written

    events, at, why, written = run_virtual(scenario())
    assert events == ["a", "b", "c"]
    assert at == pytest.approx(1.5 + 2.0)  # two seconds after the last event
    assert why == "nothing for 2 s"
    assert written[-1] == ("cancel", "r1")


def test_a_server_that_keeps_sending_is_never_stalled_however_long_the_request() -> None:
    async def scenario() -> tuple[list[str], float, str]:
        call = _Call()
        session = _session(call)
        request = await session.start("r1", ("start", "r1"))
        watch = SilenceWatch(request, 1.0, _stalled)
        sending = asyncio.create_task(_send_every(call, 0.9, [f"t{i}" for i in range(20)] + ["end"]))
        outcome = await _read_until_stalled(request)
        watch.cancel()
        await sending
        await session.close()
        return outcome

    events, at, why = run_virtual(scenario())
    assert why == "ended"
    assert events[-1] == "end" and len(events) == 21
    assert at == pytest.approx(21 * 0.9)


def test_events_waiting_for_a_slow_reader_are_not_a_stall() -> None:
    async def scenario() -> tuple[list[str], float, str]:
        call = _Call()
        session = _session(call)
        request = await session.start("r1", ("start", "r1"))
        watch = SilenceWatch(request, 1.0, _stalled)
        for event in ("a", "b"):
            call.messages.put_nowait([("r1", event)])
        await asyncio.sleep(5.0)  # the reader is busy elsewhere
        outcome = await _read_until_stalled(request)
        watch.cancel()
        await session.close()
        return outcome

    events, at, why = run_virtual(scenario())
    assert events == ["a", "b"]
    # Behind until the first check after the events were read (at 5 s), silent from then on.
    assert why == "nothing for 1 s"
    assert 5.0 < at <= 7.0


def test_a_lower_limit_takes_effect_at_once() -> None:
    async def scenario() -> tuple[list[str], float, str]:
        call = _Call()
        session = _session(call)
        request = await session.start("r1", ("start", "r1"))
        watch = SilenceWatch(request, 30.0, _stalled)  # a first event's wait
        call.messages.put_nowait([("r1", "first")])
        assert await request.read() == "first"
        watch.limit_s = 1.0  # then a gap's
        outcome = await _read_until_stalled(request)
        watch.cancel()
        await session.close()
        return outcome

    events, at, why = run_virtual(scenario())
    assert events == []
    assert at == pytest.approx(1.0)
    assert why == "nothing for 1 s"
