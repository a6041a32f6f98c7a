"""``ChatSession``: many turns on one long-lived stream, as an edge runs
them on each region.

Each start runs its turn through the gateway in a task of its own, with the
API key the start carries; the tasks put their events in one outbox and the
stream sends all it holds as one message each time it wakes. The pod's
session delivers a decode step's tokens to every turn at once, so a step
reaches the edge as one message too.

A stopping region drains its sessions (:class:`ChatSessions`). A turn's
error is an event of that turn, whether it came before the turn
was accepted (a refused key, a shed turn) or after. When the client
half-closes, the stream ends once its turns have; a cancelled stream
cancels every turn still running, whose delivered tokens are metered as
Chat's are when its caller goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator

import grpc.aio

from llmmesh.errors import AlreadyExists, Internal, InvalidArgument, MeshError, Reason, Unavailable
from llmmesh.outbox import Outbox
from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import chat_service_pb2
from region.gateway import ChatGateway

log = logging.getLogger(__name__)


class ChatSessions:
    """The region's open ChatSession streams, so that a stopping region can
    drain them: each refuses new turns (UNAVAILABLE, so the edge starts them
    in another region of the zone) and ends once its running turns have."""

    def __init__(self) -> None:
        self._runs: set[ChatSessionRun] = set()
        self.draining = False

    @property
    def streams(self) -> int:
        """ChatSession streams open now."""
        return len(self._runs)

    def open(self, gateway: ChatGateway) -> ChatSessionRun:
        run = ChatSessionRun(gateway, self)
        self._runs.add(run)
        return run

    def closed(self, run: ChatSessionRun) -> None:
        self._runs.discard(run)

    def drain(self) -> None:
        self.draining = True
        for run in self._runs:
            run.wake()


class ChatSessionRun:
    """One ``ChatSession`` call over ``gateway``, one of ``sessions``."""

    def __init__(self, gateway: ChatGateway, sessions: ChatSessions) -> None:
        self._gateway = gateway
        self._sessions = sessions
        self._outbox: Outbox[chat_service_pb2.TurnEvent] = Outbox()
        self._turns: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._half_closed = False

    async def serve(
        self, requests: AsyncIterator[chat_service_pb2.ChatSessionRequest]
    ) -> AsyncGenerator[chat_service_pb2.ChatSessionResponse, None]:
        """The stream's messages out, until the client has half-closed and
        every turn has ended."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if batch := await self._outbox.take():
                    yield chat_service_pb2.ChatSessionResponse(events=batch)
                if (self._half_closed or self._sessions.draining) and not self._turns:
                    return
        finally:
            self._sessions.closed(self)
            await cancel_and_wait(reader)
            tasks = [task for task, _ in self._turns.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def wake(self) -> None:
        self._outbox.poke()

    async def _read(self, requests: AsyncIterator[chat_service_pb2.ChatSessionRequest]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for request in requests:
                action = request.WhichOneof("action")
                if action == "start":
                    self._begin(request.start)
                elif action == "cancel":
                    self._cancel(request.cancel)
        self._half_closed = True
        self._outbox.poke()

    def _begin(self, turn: chat_service_pb2.SessionTurnStart) -> None:
        request_id = turn.start.request_id
        if not request_id:
            error: MeshError = InvalidArgument(
                Reason.INVALID_REQUEST,
                "start.request_id is required on a session",
                metadata={"param": "request_id"},
            )
            self._fail("", error)
        elif self._sessions.draining:
            error = Unavailable(Reason.REGION_UNAVAILABLE, "the region is stopping", retry_after_s=1.0)
            self._fail(request_id, error)
        elif request_id in self._turns:
            error = AlreadyExists(
                Reason.DUPLICATE_REQUEST,
                f"turn {request_id!r} already runs on this session",
                metadata={"param": "request_id"},
            )
            self._fail(request_id, error)
        else:
            cancel = asyncio.Event()
            task = asyncio.create_task(self._run(turn, cancel), name=f"turn-{request_id}")
            self._turns[request_id] = (task, cancel)

    def _cancel(self, cancel: chat_service_pb2.SessionTurnCancel) -> None:
        running = self._turns.get(cancel.request_id)
        if running is not None:
            log.info("turn %s cancelled by client: %s", cancel.request_id, cancel.reason or "no reason given")
            running[1].set()

    async def _run(self, turn: chat_service_pb2.SessionTurnStart, cancel: asyncio.Event) -> None:
        request_id = turn.start.request_id
        try:
            events = self._gateway.run_turn(turn.start, turn.api_key or None, cancel)
            async with contextlib.aclosing(events):
                async for event in events:
                    self._outbox.put(chat_service_pb2.TurnEvent(request_id=request_id, response=event))
        except MeshError as err:
            self._fail(request_id, err)
        except Exception:
            log.exception("turn %s failed", request_id)
            self._fail(request_id, Internal(Reason.INTERNAL, "the turn failed in the region"))
        finally:
            del self._turns[request_id]
            self._outbox.poke()

    def _fail(self, request_id: str, error: MeshError) -> None:
        response = chat_service_pb2.ChatResponse(error=error.to_stream_error())
        self._outbox.put(chat_service_pb2.TurnEvent(request_id=request_id, response=response))
