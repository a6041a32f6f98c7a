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

A conversation is a tree: a message may continue after any stored message
(``parent_id``) or be a new version of a stored user message (``edit_id``),
and ``POST .../messages/{message_id}/regenerate`` asks for a new reply in
place of a stored one; each makes a branch. ``GET .../branches`` lists
them, ``GET .../messages?leaf_id=`` lists one (the current one by
default). A client's id for a turn (``Idempotency-Key`` or
``client_message_id``) makes its retries safe (:mod:`edge.conversation_replays`).
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

from llmmesh.core.errors import MeshError, NotFound, Reason
from llmmesh.core.ids import ConversationId
from llmmesh.edge.caller import authenticate
from llmmesh.edge.completions import CompletionsHandler
from llmmesh.edge.conversation_objects import (
    BranchObject,
    ConversationMessageRequest,
    ConversationObject,
    CreateConversationRequest,
    DeletedConversationObject,
    IdempotentTurn,
    ListObject,
    MessageObject,
    RegenerateRequest,
)
from llmmesh.edge.conversation_replays import client_turn_id, replay, turn_request_id
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.route_headers import AUTO_MODELS
from llmmesh.edge.schemas import parse_body
from llmmesh.edge.settings import EdgeSettings
from llmmesh.edge.streams.framing import wants_event_ids
from llmmesh.v1 import chat_service_pb2, common_pb2

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
            Route(
                "/v1/conversations/{conversation_id}/messages/{message_id}/regenerate",
                self.regenerate,
                methods=["POST"],
            ),
            Route("/v1/conversations/{conversation_id}/branches", self.list_branches, methods=["GET"]),
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
        leaf_id = request.query_params.get("leaf_id", "")
        if leaf_id and not _ITEM_ID.match(leaf_id):
            raise OpenAIError(
                400, "leaf_id must be the id of a message", param="leaf_id", code="invalid_value"
            )
        message = chat_service_pb2.ListMessagesRequest(
            conversation_id=str(conversation_id),
            page_size=_limit(request),
            after_id=_after(request),
            leaf_id=leaf_id,
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
        body = parse_body(ConversationMessageRequest, await read_json(request, self._settings.max_body_bytes))
        if body.parent_id is not None and body.edit_id is not None:
            raise OpenAIError(
                400, "give parent_id or edit_id, not both", param="edit_id", code="invalid_value"
            )
        start = chat_service_pb2.ChatStart(messages=body.new_messages())
        if body.parent_id is not None:
            start.parent_message_id = body.parent_id
        if body.edit_id is not None:
            start.edit_message_id = body.edit_id
        return await self._turn(request, principal, body, start)

    async def regenerate(self, request: Request) -> Response:
        """A new reply in place of a stored one (or to a stored question): a new branch."""
        principal = await authenticate(request, self._mesh)
        message_id = request.path_params["message_id"]
        raw = await request.body()
        body = parse_body(
            RegenerateRequest, await read_json(request, self._settings.max_body_bytes) if raw else {}
        )
        if not _ITEM_ID.match(message_id):
            raise NotFound(
                Reason.MESSAGE_NOT_FOUND,
                f"message {message_id!r} not found",
                metadata={"param": "message_id"},
            )
        start = chat_service_pb2.ChatStart(regenerate_message_id=message_id)
        return await self._turn(request, principal, body, start)

    async def list_branches(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        conversation_id = _home(principal, request.path_params["conversation_id"])
        message = chat_service_pb2.ListBranchesRequest(
            conversation_id=str(conversation_id), page_size=_limit(request), after_id=_after(request)
        )
        page: chat_service_pb2.ListBranchesResponse = await _paging(
            self._mesh.in_zone(
                principal,
                lambda stub, metadata: stub.ListBranches(message, metadata=metadata, timeout=_TIMEOUT_S),
                home_region=conversation_id.home_region,
            )
        )
        items = [BranchObject.of(b) for b in page.branches]
        return _json(ListObject[BranchObject].page(items, bool(page.next_page_token)))

    async def _turn(
        self,
        request: Request,
        principal: Principal,
        body: IdempotentTurn,
        start: chat_service_pb2.ChatStart,
    ) -> Response:
        """Run ``start`` (its messages and branch point set) as the conversation's
        next turn; a retry of a turn the client named answers with its stored reply."""
        text_id = request.path_params["conversation_id"]
        conversation_id = _home(principal, text_id)
        start.sampling.CopyFrom(body.to_sampling())
        if body.llmmesh_retrieval is not None:
            start.retrieval.CopyFrom(body.llmmesh_retrieval.to_proto())
        client_id = client_turn_id(request, body.client_message_id)
        conversation = await self._conversation(principal, text_id)
        requested = getattr(body, "model", None) or conversation.model
        model = await self._mesh.models.resolve(requested, principal.tenant.tier)
        # "auto" is the region's to decide, the conversation's depth included.
        auto = requested in AUTO_MODELS
        start.request_id = (
            turn_request_id(conversation.id, client_id)
            if client_id is not None
            else "chatcmpl-" + secrets.token_hex(12)
        )
        start.model = "auto" if auto else model.name
        start.conversation_id = conversation.id
        start.user = body.end_user()
        try:
            return await self._completions.serve_turn(
                request,
                principal,
                start,
                "" if auto else model.name,
                stream=body.streaming(),
                include_usage=body.include_usage(),
                prefer_region=conversation_id.home_region,
            )
        except MeshError as err:
            if client_id is None or err.reason != Reason.DUPLICATE_REQUEST:
                param = err.metadata.get("param")
                if param in _PARAMS:
                    err.metadata["param"] = _PARAMS[param]
                raise
        stored: chat_service_pb2.ListMessagesResponse = await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.ListMessages(
                chat_service_pb2.ListMessagesRequest(
                    conversation_id=conversation.id, request_id=start.request_id
                ),
                metadata=metadata,
                timeout=_TIMEOUT_S,
            ),
            home_region=conversation_id.home_region,
        )
        asked = [m.content for m in start.messages if m.role == common_pb2.CHAT_ROLE_USER]
        return replay(
            start.request_id,
            list(stored.messages),
            asked="\n\n".join(asked) if asked else None,
            stream=body.streaming(),
            include_usage=body.include_usage(),
            headers={},
            event_ids=wants_event_ids(request),
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


_PARAMS = {
    "parent_message_id": "parent_id",
    "edit_message_id": "edit_id",
    "regenerate_message_id": "message_id",
}
"""The region's names of a turn's branch point, as this API names them."""


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
