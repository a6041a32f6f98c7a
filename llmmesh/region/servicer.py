"""The region's ChatService: a thin gRPC face over the gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio

from llmmesh.core import tracing
from llmmesh.core.errors import InvalidArgument, MeshError, Reason, Unimplemented
from llmmesh.core.grpc_tracing import caller_trace
from llmmesh.core.json_logs import bind_request_id
from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region import metrics as region_metrics
from llmmesh.region.chat_session import ChatSessions
from llmmesh.region.conversations import ConversationService
from llmmesh.region.gateway import ChatGateway
from llmmesh.region.grpc_caller import Context, caller_secret
from llmmesh.region.turn.settle import TurnSettlement
from llmmesh.region.turn.span import turn_span
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc, common_pb2

log = logging.getLogger(__name__)


def _second_start() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_REQUEST,
        "a Chat stream carries one turn; it was stopped at a second start (ChatSession carries many)",
        metadata={"param": "start"},
    )


def _no_action() -> InvalidArgument:
    return InvalidArgument(
        Reason.INVALID_REQUEST,
        "a message after the start must hold a cancel; the turn was stopped at one holding no action",
        metadata={"param": "action"},
    )


class ChatServicer(chat_service_pb2_grpc.ChatServiceServicer):
    """Serves chat turns and conversations, and describes the region."""

    def __init__(
        self,
        gateway: ChatGateway,
        conversations: ConversationService,
        region_info: Callable[[], chat_service_pb2.GetRegionInfoResponse],
        sessions: ChatSessions,
        settlement: TurnSettlement | None = None,
    ) -> None:
        self._gateway = gateway
        self._settlement = settlement
        self._sessions = sessions
        self._conversations = conversations
        self._region_info = region_info

    async def Chat(
        self, request_iterator: AsyncIterator[chat_service_pb2.ChatRequest], context: Context
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("action") != "start":
            await InvalidArgument(Reason.INVALID_REQUEST, "the first message must be 'start'").abort(context)
        cancel, refused = asyncio.Event(), list[MeshError]()
        watcher = asyncio.create_task(self._watch_controls(request_iterator, cancel, refused))
        emitted = False
        bind_request_id(first.start.request_id)
        spans = contextlib.ExitStack()
        parent = caller_trace(context) if tracing.enabled() else None
        recorder = spans.enter_context(turn_span(first.start, first.start.request_id, parent))
        try:
            turn = self._gateway.run_turn(
                first.start, caller_secret(context), cancel, deadline_s=context.time_remaining()
            )
            async for event in turn:
                emitted = True
                recorder.observe(event)
                yield event
            if refused:
                raise refused[0]
        except MeshError as raised:
            # However the stopped turn ended, the caller hears why it was stopped.
            err = refused[0] if refused else raised
            region_metrics.turn_failed(err)
            recorder.observe(chat_service_pb2.ChatResponse(error=err.to_stream_error()))
            if emitted:
                yield chat_service_pb2.ChatResponse(error=err.to_stream_error())
            else:
                await err.abort(context)
        finally:
            # Closed before any await, in the context that opened it (a detach
            # elsewhere makes OpenTelemetry log "Failed to detach context").
            spans.close()
            await cancel_and_wait(watcher)

    async def ChatSession(
        self, request_iterator: AsyncIterator[chat_service_pb2.ChatSessionRequest], context: Context
    ) -> AsyncIterator[chat_service_pb2.ChatSessionResponse]:
        run = self._sessions.open(self._gateway)
        try:
            async with contextlib.aclosing(run.serve(request_iterator)) as responses:
                async for response in responses:
                    yield response
        except MeshError as err:
            await err.abort(context)

    @staticmethod
    async def _watch_controls(
        request_iterator: AsyncIterator[chat_service_pb2.ChatRequest],
        cancel: asyncio.Event,
        refused: list[MeshError],
    ) -> None:
        """Cancel the turn on a cancel message. A second start, or a message
        holding no action, is a caller's mistake, never silently dropped: it
        cancels the turn too (which is still metered), and goes in
        ``refused`` so that the stream ends refusing it."""
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for request in request_iterator:
                action = request.WhichOneof("action")
                if action == "cancel":
                    log.info("turn cancelled by client: %s", request.cancel.reason or "no reason given")
                else:
                    refused.append(_second_start() if action == "start" else _no_action())
                cancel.set()
                return

    async def GetRegionInfo(
        self,
        request: chat_service_pb2.GetRegionInfoRequest,
        context: Context,
    ) -> chat_service_pb2.GetRegionInfoResponse:
        return self._region_info()

    async def SettleTurn(
        self, request: chat_service_pb2.SettleTurnRequest, context: Context
    ) -> chat_service_pb2.SettleTurnResponse:
        try:
            if self._settlement is None:
                raise Unimplemented(Reason.INVALID_REQUEST, "this region settles no turns")
            return await self._settlement.settle(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def CreateConversation(
        self, request: chat_service_pb2.CreateConversationRequest, context: Context
    ) -> chat_service_pb2.CreateConversationResponse:
        try:
            return await self._conversations.create(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def GetConversation(
        self, request: chat_service_pb2.GetConversationRequest, context: Context
    ) -> chat_service_pb2.GetConversationResponse:
        try:
            return await self._conversations.get(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def ListConversations(
        self, request: chat_service_pb2.ListConversationsRequest, context: Context
    ) -> chat_service_pb2.ListConversationsResponse:
        try:
            return await self._conversations.list(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def DeleteConversation(
        self, request: chat_service_pb2.DeleteConversationRequest, context: Context
    ) -> chat_service_pb2.DeleteConversationResponse:
        try:
            return await self._conversations.delete(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def ListMessages(
        self, request: chat_service_pb2.ListMessagesRequest, context: Context
    ) -> chat_service_pb2.ListMessagesResponse:
        try:
            return await self._conversations.list_messages(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)

    async def ListBranches(
        self, request: chat_service_pb2.ListBranchesRequest, context: Context
    ) -> chat_service_pb2.ListBranchesResponse:
        try:
            return await self._conversations.list_branches(request, caller_secret(context))
        except MeshError as err:
            await err.abort(context)


def region_health(healthy_pods: int, total_pods: int) -> common_pb2.HealthState.ValueType:
    """A region serves while any pod does; it is degraded while some do not."""
    if healthy_pods == 0:
        return common_pb2.HEALTH_STATE_DOWN
    if healthy_pods < total_pods:
        return common_pb2.HEALTH_STATE_DEGRADED
    return common_pb2.HEALTH_STATE_SERVING
