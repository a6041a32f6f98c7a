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

from llmmesh.core import tracing
from llmmesh.core.errors import Internal, MeshError, Reason, Unavailable
from llmmesh.core.json_logs import bind_request_id
from llmmesh.core.session_server import SessionServer
from llmmesh.region import metrics as region_metrics
from llmmesh.region.gateway import ChatGateway
from llmmesh.region.turn.span import turn_span
from llmmesh.v1 import chat_service_pb2 as pb

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


class ChatSessionRun(SessionServer[pb.SessionTurnStart, pb.TurnEvent, pb.ChatSessionResponse]):
    """One ``ChatSession`` call over ``gateway``, one of ``sessions``."""

    kind = "turn"
    internal = Internal(Reason.INTERNAL, "the turn failed in the region")

    def __init__(self, gateway: ChatGateway, sessions: ChatSessions) -> None:
        super().__init__()
        self._gateway = gateway
        self._sessions = sessions
        self._cancels: dict[str, asyncio.Event] = {}

    def request_id(self, start: pb.SessionTurnStart) -> str:
        return start.start.request_id

    def error_event(self, request_id: str, error: MeshError) -> pb.TurnEvent:
        region_metrics.turn_failed(error)
        return self.cancel_refused(request_id, error)

    def cancel_refused(self, request_id: str, error: MeshError) -> pb.TurnEvent:
        response = pb.ChatResponse(error=error.to_stream_error())
        return pb.TurnEvent(request_id=request_id, response=response)

    def response(self, events: list[pb.TurnEvent]) -> pb.ChatSessionResponse:
        response = pb.ChatSessionResponse()
        response.events.extend(events)
        return response

    def refusal(self, request_id: str) -> MeshError | None:
        if self._sessions.draining:
            return Unavailable(Reason.REGION_UNAVAILABLE, "the region is stopping", retry_after_s=1.0)
        return None

    def stopping(self) -> bool:
        return self._sessions.draining

    def closed(self) -> None:
        self._sessions.closed(self)

    async def cancel(self, request_id: str, reason: str) -> None:
        log.info("turn %s cancelled by client: %s", request_id, reason)
        self._cancels.setdefault(request_id, asyncio.Event()).set()

    async def run(self, request_id: str, start: pb.SessionTurnStart) -> None:
        cancel = self._cancels.setdefault(request_id, asyncio.Event())
        bind_request_id(request_id)
        parent = tracing.context_of_message(start.trace_context) if tracing.enabled() else None
        try:
            with turn_span(start.start, request_id, parent) as recorder:
                events = self._gateway.run_turn(start.start, start.api_key or None, cancel)
                async with contextlib.aclosing(events):
                    async for event in events:
                        recorder.observe(event)
                        turn_event = pb.TurnEvent(request_id=request_id)
                        turn_event.response.CopyFrom(event)
                        self.outbox.put(turn_event)
        finally:
            del self._cancels[request_id]
