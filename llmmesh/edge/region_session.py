"""The edge's side of a region's ``ChatSession``: one long-lived stream per
region that every turn the edge opens there shares (see
:mod:`llmmesh.core.session_client`). A start carries its caller's API key;
when the stream breaks, every turn on it raises :class:`SessionLost`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from llmmesh.core import tracing
from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.session_client import SessionClient, SessionRequest, ends_its_request
from llmmesh.v1 import chat_service_pb2 as pb
from llmmesh.v1 import chat_service_pb2_grpc as pb_grpc

RegionSession: TypeAlias = SessionClient[pb.ChatSessionRequest, pb.ChatResponse]
SessionTurn: TypeAlias = SessionRequest[pb.ChatSessionRequest, pb.ChatResponse]


class SessionLost(Unavailable):
    """The session stream to a region broke (or could not be opened)."""


def region_session(stub: pb_grpc.ChatServiceStub, address: str) -> RegionSession:
    """The session stream to the region behind ``stub``, opened on first use."""

    def events_of(message: pb.ChatSessionResponse) -> Iterable[tuple[str, pb.ChatResponse]]:
        return ((event.request_id, event.response) for event in message.events)

    def cancel(request_id: str, reason: str) -> pb.ChatSessionRequest:
        return pb.ChatSessionRequest(cancel=pb.SessionTurnCancel(request_id=request_id, reason=reason))

    def broken(cause: str) -> SessionLost:
        message = f"the stream to {address} broke ({cause})"
        return SessionLost(Reason.REGION_UNAVAILABLE, message, retry_after_s=1.0)

    return SessionClient(
        address,
        stub.ChatSession,
        events_of,
        ends_its_request,
        cancel,
        broken,
        batch_starts=True,
    )


def start_message(start: pb.ChatStart, api_key: str) -> pb.ChatSessionRequest:
    """The session message that starts ``start``, in the current span's trace."""
    trace_context = tracing.trace_context_message()
    return pb.ChatSessionRequest(
        start=pb.SessionTurnStart(start=start, api_key=api_key, trace_context=trace_context)
    )
