"""Opening a chat turn on the tenant's regions, best first, and reading it.

A region that cannot be reached before it accepts the turn is skipped for
the next one of the zone; a region that answers with an error ends the turn
with that error. Once accepted, a stream that breaks (the connection lost or
reset, the stream ended without a finish, an error event saying the region
or its engine failed, or no event for ``stall_timeout_s`` while generating)
raises :class:`RegionLost`, which :mod:`edge.failover` continues elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection
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

# Transport failures of an accepted stream: the region, or the way to it, broke.
_BROKEN_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
# Error events that say the region or its engine failed, not the caller or the content.
_FAILED_REASONS = frozenset({Reason.REGION_UNAVAILABLE, Reason.ENGINE_FAILED, Reason.ENGINE_UNAVAILABLE})


class RegionLost(Unavailable):
    """The region's stream broke after it accepted the turn; the turn may
    go on in another region of the zone from what was delivered."""

    def __init__(self, region: str, message: str, cause: MeshError | None = None) -> None:
        super().__init__(
            cause.reason if cause is not None else Reason.REGION_UNAVAILABLE,
            f"region {region}: {message}",
            retry_after_s=1.0,
        )
        self.region = region


@dataclass
class OpenTurn:
    """A turn a region has accepted.

    ``first_delta_timeout_s`` bounds the wait for its first delta (queueing
    and prefill), ``stall_timeout_s`` every later gap; None waits forever.
    """

    call: ChatCall
    started: chat_service_pb2.ChatStarted
    usage: common_pb2.TokenUsage = field(default_factory=common_pb2.TokenUsage)
    reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    # The output filter's verdict when it flagged the reply.
    safety: chat_service_pb2.SafetyVerdict | None = None
    first_delta_timeout_s: float | None = None
    stall_timeout_s: float | None = None

    @property
    def region(self) -> str:
        return self.started.region

    async def deltas(self) -> AsyncIterator[chat_service_pb2.ChatDelta]:
        """The turn's output deltas; ``usage``, ``reason`` and ``safety`` are
        set once it ends. A broken stream raises :class:`RegionLost`; an
        error event from the region raises its MeshError."""
        timeout_s = self.first_delta_timeout_s
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    event = await self.call.read()
            except TimeoutError:
                raise RegionLost(self.region, f"no event for {timeout_s:g} s while generating") from None
            except grpc.aio.AioRpcError as err:
                if self.reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    break  # the turn had finished: a late transport error changes nothing
                if err.code() in _BROKEN_CODES:
                    raise RegionLost(
                        self.region, f"stream broke ({err.code().name}: {err.details()})"
                    ) from err
                raise from_rpc_error(err) from err
            if event is grpc.aio.EOF:
                break
            assert isinstance(event, chat_service_pb2.ChatResponse)
            kind = event.WhichOneof("event")
            if kind == "delta":
                timeout_s = self.stall_timeout_s
                yield event.delta
            elif kind == "usage":
                self.usage = event.usage.usage
            elif kind == "safety" and event.safety.flagged:
                self.safety = event.safety
            elif kind == "finished":
                self.reason = event.finished.reason
            elif kind == "error":
                error = from_stream_error(event.error)
                if error.reason in _FAILED_REASONS:
                    raise RegionLost(self.region, error.message, error)
                raise error
        if self.reason == common_pb2.FINISH_REASON_UNSPECIFIED:
            raise RegionLost(self.region, "the stream ended without a finish event")

    async def cancel(self, reason: str) -> None:
        """Ask the region to stop the turn; its usage is still metered."""
        try:
            await self.call.write(
                chat_service_pb2.ChatRequest(cancel=chat_service_pb2.ChatCancel(reason=reason))
            )
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
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
    *,
    exclude: Collection[str] = (),
    tried: set[str] | None = None,
) -> OpenTurn:
    """Start the turn on the first region of the tenant's zone that accepts it.

    ``prefer_region``, when it is one of the tenant's regions, is tried first
    (a conversation's follow-up goes to its home region); the others keep
    their order behind it. Regions in ``exclude`` are left out; each region
    tried is added to ``tried``.
    """
    regions = [r for r in await mesh.route(principal.tenant.id, model) if r.report.region not in exclude]
    if prefer_region:
        regions.sort(key=lambda r: r.report.region != prefer_region)
    last_error: MeshError | None = None
    for region in regions:
        if tried is not None:
            tried.add(region.report.region)
        address = region.report.chat_address
        call: ChatCall = mesh.chat(address).Chat(metadata=(("authorization", f"Bearer {principal.secret}"),))
        try:
            await call.write(chat_service_pb2.ChatRequest(start=start))
            async with asyncio.timeout(timeout_s):
                first = await call.read()
        except TimeoutError:
            call.cancel()
            mesh.forget_region(region.report.region)
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
                mesh.forget_region(region.report.region)
                last_error = from_rpc_error(err)
                continue
            raise from_rpc_error(err) from err
        if first is grpc.aio.EOF:
            mesh.forget_region(region.report.region)
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
