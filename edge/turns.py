"""Opening a chat turn on the tenant's regions, best first.

A region that cannot be reached before it accepts the turn is skipped for
the next one of the zone; a region that answers with an error ends the turn
with that error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc
import grpc.aio

from edge.mesh_client import MeshClient, Principal
from llmmesh.errors import MeshError, Reason, Unavailable, from_rpc_error, from_stream_error
from llmmesh.v1 import chat_service_pb2, common_pb2

log = logging.getLogger(__name__)

# grpc ships no type stubs; the alias names what the value is.
ChatCall: TypeAlias = grpc.aio.StreamStreamCall


@dataclass
class OpenTurn:
    """A turn a region has accepted."""

    call: ChatCall
    started: chat_service_pb2.ChatStarted
    usage: common_pb2.TokenUsage = field(default_factory=common_pb2.TokenUsage)
    reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    # The output filter's verdict when it flagged the reply.
    safety: chat_service_pb2.SafetyVerdict | None = None

    async def deltas(self) -> AsyncIterator[chat_service_pb2.ChatDelta]:
        """The turn's output deltas; ``usage``, ``reason`` and ``safety`` are
        set once it ends. A broken stream, an error event or a missing finish
        raises MeshError."""
        while True:
            try:
                event = await self.call.read()
            except grpc.aio.AioRpcError as err:
                raise from_rpc_error(err) from err
            if event is grpc.aio.EOF:
                break
            assert isinstance(event, chat_service_pb2.ChatResponse)
            kind = event.WhichOneof("event")
            if kind == "delta":
                yield event.delta
            elif kind == "usage":
                self.usage = event.usage.usage
            elif kind == "safety" and event.safety.flagged:
                self.safety = event.safety
            elif kind == "finished":
                self.reason = event.finished.reason
            elif kind == "error":
                raise from_stream_error(event.error)
        if self.reason == common_pb2.FINISH_REASON_UNSPECIFIED:
            raise Unavailable(Reason.REGION_UNAVAILABLE, "the region stream ended without a finish event")

    async def cancel(self, reason: str) -> None:
        """Ask the region to stop the turn; its usage is still metered."""
        try:
            await self.call.write(
                chat_service_pb2.ChatRequest(cancel=chat_service_pb2.ChatCancel(reason=reason))
            )
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            self.call.cancel()

    def close(self) -> None:
        if not self.call.done():
            self.call.cancel()


async def open_turn(
    mesh: MeshClient,
    principal: Principal,
    start: chat_service_pb2.ChatStart,
    model: str,
    timeout_s: float,
    prefer_region: str = "",
) -> OpenTurn:
    """Start the turn on the first region of the tenant's zone that accepts it.

    ``prefer_region``, when it is one of the tenant's regions, is tried first
    (a conversation's follow-up goes to its home region); the others keep
    their order behind it.
    """
    regions = await mesh.route(principal.tenant.id, model)
    if prefer_region:
        regions.sort(key=lambda r: r.report.region != prefer_region)
    last_error: MeshError | None = None
    for region in regions:
        address = region.report.chat_address
        call: ChatCall = mesh.chat(address).Chat(metadata=(("authorization", f"Bearer {principal.secret}"),))
        try:
            await call.write(chat_service_pb2.ChatRequest(start=start))
            async with asyncio.timeout(timeout_s):
                first = await call.read()
        except TimeoutError:
            call.cancel()
            last_error = Unavailable(
                Reason.REGION_UNAVAILABLE,
                f"region {region.report.region} did not accept the turn in time",
                retry_after_s=1.0,
            )
            continue
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                log.warning(
                    "region %s unreachable (%s); trying the next", region.report.region, err.details()
                )
                last_error = from_rpc_error(err)
                continue
            raise from_rpc_error(err) from err
        if first is grpc.aio.EOF:
            last_error = Unavailable(
                Reason.REGION_UNAVAILABLE, "the region closed the stream", retry_after_s=1.0
            )
            continue
        assert isinstance(first, chat_service_pb2.ChatResponse)
        kind = first.WhichOneof("event")
        if kind == "error":
            call.cancel()
            raise from_stream_error(first.error)
        if kind != "started":
            call.cancel()
            raise Unavailable(Reason.REGION_UNAVAILABLE, f"the region opened the stream with {kind!r}")
        return OpenTurn(call=call, started=first.started)
    raise last_error or Unavailable(Reason.NO_REGION_IN_ZONE, "no region can serve this request")
