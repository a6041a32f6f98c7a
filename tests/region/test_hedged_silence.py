"""A hedged generation is watched for silence as a plain one is: its
winner's pod going quiet mid-stream stops the turn's reader (virtual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from llmmesh.bench.virtual_clock import run_virtual
from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.session_client import SessionClient, SilenceWatch
from llmmesh.region.placement.hedging import HedgedGeneration, _Leg
from llmmesh.v1 import engine_service_pb2 as pb


class _Call:
    def __init__(self) -> None:
        self.messages: asyncio.Queue[list[tuple[str, pb.GenerationEvent]]] = asyncio.Queue()

    async def _messages(self) -> AsyncIterator[list[tuple[str, pb.GenerationEvent]]]:
        while True:
            yield await self.messages.get()

    def __aiter__(self) -> AsyncIterator[list[tuple[str, pb.GenerationEvent]]]:
        return self._messages()

    async def write(self, message: Any) -> None:
        pass

    def cancel(self) -> None:
        pass


def _event(kind: str) -> pb.GenerationEvent:
    if kind == "started":
        return pb.GenerationEvent(request_id="g", started=pb.GenerateStarted())
    return pb.GenerationEvent(request_id="g", delta=pb.TokenDelta(text="x", token_ids=[7]))


def test_a_hedged_turn_whose_winner_goes_quiet_is_stopped_by_its_watch() -> None:
    async def scenario() -> tuple[list[str], float, str]:
        call = _Call()
        session: SessionClient[Any, pb.GenerationEvent] = SessionClient(
            "pod",
            lambda: call,
            lambda message: message,
            lambda event: event.WhichOneof("event") in ("finished", "error"),
            lambda request_id, reason: None,
            lambda cause: Unavailable(Reason.ENGINE_FAILED, cause),
        )
        generation = await session.start("g", None)
        pod = SimpleNamespace(pod_id="pod-a", in_flight=1)

        async def no_backup() -> None:
            return None

        hedged = HedgedGeneration(_Leg(pod, generation), no_backup, pb.GenerateSessionRequest(), 60.0)  # type: ignore[arg-type]
        for kind in ("started", "delta"):
            call.messages.put_nowait([("g", _event(kind))])
        read: list[str] = []
        first = await hedged.read()
        assert first is not None
        read.append(str(first.WhichOneof("event")))
        watch = SilenceWatch(hedged, 2.0, lambda s: Unavailable(Reason.ENGINE_FAILED, f"quiet for {s:g} s"))
        loop = asyncio.get_running_loop()
        try:
            while (event := await hedged.read()) is not None:
                read.append(str(event.WhichOneof("event")))
        except Unavailable as err:
            outcome = (read, loop.time(), err.message)
        watch.cancel()
        hedged.abandon("done")
        await session.close()
        return outcome

    read, at, why = run_virtual(scenario())
    assert read == ["started", "delta"]
    assert at == pytest.approx(2.0)
    assert why == "quiet for 2 s"
