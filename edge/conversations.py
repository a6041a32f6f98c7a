"""The conversations API: ``/v1/conversations`` and its messages, over the
region's ChatService conversation RPCs.

A conversation id names its zone and home region
(``conv_<zone>_<region>_<random>``), so every call about one goes to its home
region first, with no global lookup of content; only the region's address
comes from geo-routing. An id that is malformed or of another zone than the
caller's is answered exactly as a missing or deleted conversation is (404
``conversation_not_found``): nothing can be learnt from it. A new
conversation is created in the first region geo-routing names for the tenant.
A message streams its reply exactly as a chat completion does, with the
history kept by the region.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.completions import CompletionsHandler, authenticate
from edge.conversation_objects import (
    ConversationMessageRequest,
    ConversationObject,
    CreateConversationRequest,
    DeletedConversationObject,
    ListObject,
    MessageObject,
)
from edge.errors import OpenAIError
from edge.json_body import read_json
from edge.mesh_client import MeshClient, Principal
from edge.schemas import parse_body
from edge.settings import EdgeSettings
from llmmesh.errors import MeshError, NotFound, Reason
from llmmesh.ids import ConversationId
from llmmesh.v1 import chat_service_pb2

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
"""A list page holds ``limit`` items: 20 unless asked, at most 100, as OpenAI's lists."""

_TIMEOUT_S = 10.0
# Every conversation and message id the mesh issues fits; anything else is
# refused here rather than echoed back through a region.
_ITEM_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")

T = TypeVar("T")


class ConversationsHandler:
    """Serves the conversations API through the tenant's zone."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient, completions: CompletionsHandler) -> None:
        self._settings = settings
        self._mesh = mesh
        self._completions = completions

    def routes(self) -> list[Route]:
        return [
            Route("/v1/conversations", self.create, methods=["POST"]),
            Route("/v1/conversations", self.list, methods=["GET"]),
            Route("/v1/conversations/{conversation_id}", self.get, methods=["GET"]),
            Route("/v1/conversations/{conversation_id}", self.delete, methods=["DELETE"]),
            Route("/v1/conversations/{conversation_id}/messages", self.send_message, methods=["POST"]),
            Route("/v1/conversations/{conversation_id}/messages", self.list_messages, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        raw = await request.body()
        body = parse_body(
            CreateConversationRequest, await read_json(request, self._settings.max_body_bytes) if raw else {}
        )
        message = chat_service_pb2.CreateConversationRequest(
            title=body.title or "", model=body.model or "", system_prompt=body.system_prompt or ""
        )
        created: chat_service_pb2.CreateConversationResponse = await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.CreateConversation(message, metadata=metadata, timeout=_TIMEOUT_S),
        )
        return _json(ConversationObject.of(created.conversation))

    async def get(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        conversation = await self._conversation(principal, request.path_params["conversation_id"])
        return _json(ConversationObject.of(conversation))

    async def list(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        message = chat_service_pb2.ListConversationsRequest(
            page_size=_limit(request), after_id=_after(request)
        )
        page: chat_service_pb2.ListConversationsResponse = await _paging(
            self._mesh.in_zone(
                principal,
                lambda stub, metadata: stub.ListConversations(message, metadata=metadata, timeout=_TIMEOUT_S),
            )
        )
        items = [ConversationObject.of(c) for c in page.conversations]
        return _json(ListObject[ConversationObject].page(items, bool(page.next_page_token)))

    async def delete(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        conversation_id = _home(principal, request.path_params["conversation_id"])
        message = chat_service_pb2.DeleteConversationRequest(conversation_id=str(conversation_id))
        deleted: chat_service_pb2.DeleteConversationResponse = await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.DeleteConversation(message, metadata=metadata, timeout=_TIMEOUT_S),
            home_region=conversation_id.home_region,
        )
        return _json(DeletedConversationObject(id=deleted.conversation.id))

    async def list_messages(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        conversation_id = _home(principal, request.path_params["conversation_id"])
        message = chat_service_pb2.ListMessagesRequest(
            conversation_id=str(conversation_id),
            page_size=_limit(request),
            after_id=_after(request),
        )
        page: chat_service_pb2.ListMessagesResponse = await _paging(
            self._mesh.in_zone(
                principal,
                lambda stub, metadata: stub.ListMessages(message, metadata=metadata, timeout=_TIMEOUT_S),
                home_region=conversation_id.home_region,
            )
        )
        items = [MessageObject.of(m) for m in page.messages]
        return _json(ListObject[MessageObject].page(items, bool(page.next_page_token)))

    async def send_message(self, request: Request) -> Response:
        """Run the conversation's next turn: the reply streams (or returns) as
        a chat completion, and the region stores both messages."""
        principal = await authenticate(request, self._mesh)
        text_id = request.path_params["conversation_id"]
        conversation_id = _home(principal, text_id)
        body = parse_body(ConversationMessageRequest, await read_json(request, self._settings.max_body_bytes))
        sampling = body.to_sampling()
        messages = body.new_messages()
        conversation = await self._conversation(principal, text_id)
        model = await self._mesh.models.resolve(body.model or conversation.model, principal.tenant.tier)
        start = chat_service_pb2.ChatStart(
            request_id="chatcmpl-" + secrets.token_hex(12),
            model=model.name,
            messages=messages,
            sampling=sampling,
            conversation_id=conversation.id,
            user=body.end_user(),
        )
        return await self._completions.serve_turn(
            request,
            principal,
            start,
            model.name,
            stream=body.streaming(),
            include_usage=body.include_usage(),
            prefer_region=conversation_id.home_region,
        )

    async def _conversation(self, principal: Principal, text: str) -> chat_service_pb2.Conversation:
        conversation_id = _home(principal, text)
        message = chat_service_pb2.GetConversationRequest(conversation_id=str(conversation_id))
        got: chat_service_pb2.GetConversationResponse = await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.GetConversation(message, metadata=metadata, timeout=_TIMEOUT_S),
            home_region=conversation_id.home_region,
        )
        return got.conversation


def _home(principal: Principal, text: str) -> ConversationId:
    """The conversation id in ``text`` when it could be one of the caller's; a 404 otherwise."""
    parsed = ConversationId.parse(text)
    if parsed is None or parsed.zone != principal.tenant.zone:
        raise NotFound(
            Reason.CONVERSATION_NOT_FOUND,
            f"conversation {text!r} not found",
            metadata={"conversation_id": text},
        )
    return parsed


def _limit(request: Request) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise OpenAIError(
            400, f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit", code="invalid_value"
        )
    return int(text)


def _after(request: Request) -> str:
    """``after``: empty, or what could be the id of a listed item."""
    text = request.query_params.get("after", "")
    if text and not _ITEM_ID.match(text):
        raise _after_refused()
    return text


def _after_refused() -> OpenAIError:
    return OpenAIError(
        400, "after must be the id of an item of this list", param="after", code="invalid_value"
    )


async def _paging(pending: Awaitable[T]) -> T:
    """A list call's answer, its refusal of ``after`` named as the edge's parameter."""
    try:
        return await pending
    except MeshError as err:
        if err.metadata.get("param") != "after_id":
            raise
        raise _after_refused() from err


def _json(body: BaseModel) -> Response:
    return JSONResponse(body.model_dump(mode="json"))
