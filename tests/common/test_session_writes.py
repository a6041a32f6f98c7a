"""A session client's writes: messages given while another is written go
out after it, in order, starts given together as one message; a writer
cancelled while it waits takes its message back, and one cancelled while
it writes others' messages loses none of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmmesh.region.engine_session import EngineSession, engine_session
from llmmesh.v1 import engine_service_pb2 as pb

pytestmark = pytest.mark.asyncio


class _GatedCall:
    """A session stream each of whose writes waits until the test lets one finish."""

    def __init__(self) -> None:
        self.written: list[pb.GenerateSessionRequest] = []
        self.finish: asyncio.Queue[None] = asyncio.Queue()

    async def _nothing(self) -> AsyncIterator[pb.GenerateSessionResponse]:
        await asyncio.Event().wait()
        yield pb.GenerateSessionResponse()

    def __aiter__(self) -> AsyncIterator[pb.GenerateSessionResponse]:
        return self._nothing()

    async def write(self, message: pb.GenerateSessionRequest) -> None:
        self.written.append(message)
        await self.finish.get()

    def cancel(self) -> None:
        pass


class _Stub:
    def __init__(self, call: _GatedCall) -> None:
        self.GenerateSession = lambda: call


def _start(request_id: str) -> pb.GenerateSessionRequest:
    return pb.GenerateSessionRequest(start=pb.GenerateStart(request_id=request_id))


def _shape(message: pb.GenerateSessionRequest) -> Any:
    """A written message as the test reads it: a start's id, a cancel's, or a batch's ids."""
    action = message.WhichOneof("action")
    if action == "start":
        return message.start.request_id
    if action == "cancel":
        return ("cancel", message.cancel.request_id)
    return [start.request_id for start in message.starts.starts]


async def _writing_r1() -> tuple[EngineSession, _GatedCall, asyncio.Task[Any]]:
    """A session whose first start, r1, is being written."""
    call = _GatedCall()
    session = engine_session(_Stub(call), "pod-a")  # type: ignore[arg-type]
    first = asyncio.create_task(session.start("r1", _start("r1")))
    await _settle()
    return session, call, first


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_starts_given_during_a_write_go_out_as_one_message_after_it() -> None:
    session, call, first = await _writing_r1()
    rest = [asyncio.create_task(session.start(f"r{i}", _start(f"r{i}"))) for i in (2, 3, 4)]
    await _settle()
    assert [_shape(m) for m in call.written] == ["r1"]
    assert not any(task.done() for task in [first, *rest])
    call.finish.put_nowait(None)
    await _settle()
    assert first.done() and not any(task.done() for task in rest), "the others wait for their own write"
    assert [_shape(m) for m in call.written] == ["r1", ["r2", "r3", "r4"]]
    call.finish.put_nowait(None)
    requests = await asyncio.gather(*rest)
    assert [request.request_id for request in requests] == ["r2", "r3", "r4"]
    assert session.running == 4
    await session.close()


async def test_a_cancel_keeps_its_place_between_the_starts_around_it() -> None:
    session, call, first = await _writing_r1()
    given = [
        session.start("r2", _start("r2")),
        session.start("r3", _start("r3")),
        session.write(pb.GenerateSessionRequest(cancel=pb.GenerateCancel(request_id="r1"))),
        session.start("r4", _start("r4")),
    ]
    tasks = [asyncio.create_task(g) for g in given]
    await _settle()
    for _ in range(4):
        call.finish.put_nowait(None)
    await asyncio.gather(first, *tasks)
    assert [_shape(m) for m in call.written] == ["r1", ["r2", "r3"], ("cancel", "r1"), "r4"]
    await session.close()


async def test_a_writer_cancelled_while_it_waits_takes_its_message_back() -> None:
    session, call, first = await _writing_r1()
    waiting = asyncio.create_task(session.write(_start("gone")))
    kept = asyncio.create_task(session.write(_start("r2")))
    await _settle()
    waiting.cancel()
    await _settle()
    call.finish.put_nowait(None)
    call.finish.put_nowait(None)
    await asyncio.gather(first, kept)
    assert waiting.cancelled()
    assert [_shape(m) for m in call.written] == ["r1", "r2"]
    await session.close()


async def test_a_writer_cancelled_while_it_writes_others_messages_loses_none_of_them() -> None:
    session, call, first = await _writing_r1()
    holder = asyncio.create_task(session.write(_start("r2")))
    other = asyncio.create_task(session.write(_start("r3")))
    await _settle()
    call.finish.put_nowait(None)  # r1 written: the holder writes r2 and r3 together
    await _settle()
    assert [_shape(m) for m in call.written] == ["r1", ["r2", "r3"]]
    holder.cancel()
    await _settle()
    assert holder.cancelled(), "the holder stops at once"
    cut_in = asyncio.create_task(session.write(_start("r4")))
    await _settle()
    assert not other.done() and not cut_in.done(), "the write goes on, and the lock stays held"
    assert [_shape(m) for m in call.written] == ["r1", ["r2", "r3"]]
    call.finish.put_nowait(None)  # the batch written: r3's writer is done, r4's writes it
    await asyncio.gather(first, other)
    await _settle()
    assert not cut_in.done()
    call.finish.put_nowait(None)
    await cut_in
    assert [_shape(m) for m in call.written] == ["r1", ["r2", "r3"], "r4"]
    await session.close()


class _BreakingCall(_GatedCall):
    """A gated stream whose server ends it when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.end = asyncio.Event()

    async def _nothing(self) -> AsyncIterator[pb.GenerateSessionResponse]:
        await self.end.wait()
        ended: tuple[pb.GenerateSessionResponse, ...] = ()
        for message in ended:
            yield message


async def test_messages_given_for_a_stream_that_broke_never_reach_the_next_one() -> None:
    broken, fresh = _BreakingCall(), _GatedCall()
    calls = [broken, fresh]
    stub = _Stub(broken)
    stub.GenerateSession = lambda: calls.pop(0)
    session = engine_session(stub, "pod-a")  # type: ignore[arg-type]
    first = asyncio.create_task(session.start("r1", _start("r1")))
    await _settle()
    stale = asyncio.create_task(session.start("r2", _start("r2")))
    await _settle()
    broken.end.set()  # the stream breaks while r2 waits to be written
    await _settle()
    assert session.running == 0, "the broken stream's requests failed"
    later = asyncio.create_task(session.start("r3", _start("r3")))
    await _settle()
    broken.finish.put_nowait(None)
    fresh.finish.put_nowait(None)
    await asyncio.gather(first, stale, later)
    assert [_shape(m) for m in broken.written] == ["r1"]
    assert [_shape(m) for m in fresh.written] == ["r3"]
    await session.close()
