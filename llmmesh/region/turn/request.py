"""A chat turn at the region's door, and the turn the prepare stage hands on.

:class:`TurnRequest` is built once, when the turn arrives: it owns a copy of
the caller's start message, so what the stages add to it (a regeneration's
draw, excerpts, facts) never changes the message the caller holds.
:class:`ReadyTurn` is what preparing it decided: who asks, the model and
why, and the prompt as the engine will see it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from llmmesh.core.access import require_caller
from llmmesh.core.errors import PermissionDenied, Reason
from llmmesh.core.hop_timing import HopStamps
from llmmesh.core.identity import Role as PlaneRole
from llmmesh.region.policy_cache import Caller
from llmmesh.region.turn.state import PreparedTurn
from llmmesh.v1 import chat_service_pb2, common_pb2, retrieval_service_pb2


@dataclass(frozen=True)
class TurnRequest:
    """One turn as it arrived: the turn's own start message, the caller's
    API key, the caller's cancel signal and how long it will wait."""

    start: chat_service_pb2.ChatStart
    secret: str | None
    cancel: asyncio.Event
    # How long the caller will wait (None: no deadline); a turn that would queue longer is shed.
    deadline_s: float | None
    # Whether the caller may continue a failed-over turn (:func:`require_continuation_allowed`).
    allow_continuation: bool
    arrived_s: float
    # The turn's way to its first token through the region (region.metrics.HOPS).
    hops: HopStamps = field(default_factory=HopStamps)

    @classmethod
    def arrived(
        cls,
        start: chat_service_pb2.ChatStart,
        secret: str | None,
        cancel: asyncio.Event,
        deadline_s: float | None = None,
        *,
        allow_continuation: bool = True,
    ) -> TurnRequest:
        own = chat_service_pb2.ChatStart()
        own.CopyFrom(start)
        arrived_s = time.monotonic()
        return cls(own, secret, cancel, deadline_s, allow_continuation, arrived_s, HopStamps(arrived_s))

    @property
    def continuation(self) -> chat_service_pb2.Continuation | None:
        """What a failed-over turn's client already has; None for a turn of its own."""
        return self.start.continuation if self.start.HasField("continuation") else None


@dataclass(frozen=True)
class ReadyTurn:
    """A prepared turn, ready for admission."""

    request: TurnRequest
    caller: Caller
    # The model the turn runs on and why it was chosen.
    route: chat_service_pb2.RouteDecision
    # A conversation turn's retrieval excerpts and facts, ahead of its fitted history.
    lead: tuple[common_pb2.ChatMessage, ...]
    # What retrieval put in the turn's context (None: the turn asked for none).
    retrieval: retrieval_service_pb2.ChatRetrievalReport | None
    prepared: PreparedTurn


def require_continuation_allowed(start: chat_service_pb2.ChatStart, allow_continuation: bool) -> None:
    """Whether this caller may send a continuation at all, decided before any
    work: a continuation's carried tokens become the reply's beginning, so
    only a caller trusted to report what a client received (an edge) may
    send one. PERMISSION_DENIED otherwise."""
    if not start.HasField("continuation"):
        return
    if not allow_continuation:
        raise PermissionDenied(
            Reason.PEER_NOT_ALLOWED,
            "this caller may not continue a turn",
            metadata={"param": "continuation"},
        )
    # On a secured region, only the edge's certificate vouches for what a client received.
    require_caller((PlaneRole.EDGE,), "continue a failed-over turn")
