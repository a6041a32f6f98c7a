"""The region's side of a pod's ``GenerateSession``: one long-lived stream
per pod that every turn placed on the pod shares (see
:mod:`llmmesh.core.session_client`). When it breaks, every generation on it
fails with UNAVAILABLE ``ENGINE_FAILED``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.core.session_client import SessionClient, SessionRequest, ends_its_request
from llmmesh.v1 import engine_service_pb2 as pb
from llmmesh.v1 import engine_service_pb2_grpc as pb_grpc

EngineSession: TypeAlias = SessionClient[pb.GenerateSessionRequest, pb.GenerationEvent]
SessionGeneration: TypeAlias = SessionRequest[pb.GenerateSessionRequest, pb.GenerationEvent]


def engine_session(stub: pb_grpc.EngineServiceStub, pod_name: str) -> EngineSession:
    """The session stream to the pod behind ``stub``, opened on first use."""

    def events_of(message: pb.GenerateSessionResponse) -> Iterable[tuple[str, pb.GenerationEvent]]:
        return ((event.request_id, event) for event in message.events)

    def cancel(request_id: str, reason: str) -> pb.GenerateSessionRequest:
        return pb.GenerateSessionRequest(cancel=pb.GenerateCancel(request_id=request_id, reason=reason))

    def broken(cause: str) -> Unavailable:
        return Unavailable(Reason.ENGINE_FAILED, f"engine pod {pod_name} failed ({cause})", retry_after_s=1.0)

    return SessionClient(
        pod_name,
        stub.GenerateSession,
        events_of,
        ends_its_request,
        cancel,
        broken,
        batch_starts=True,
    )
