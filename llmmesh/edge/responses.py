"""The Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.

A response is a chat turn on the same path as chat completions
(:meth:`CompletionsHandler.serve_turn`: failover, resumable streams, usage
and billing alike), its request translated by :mod:`edge.response_request`
and its answer shaped by :mod:`edge.response_events`.

Stored responses (``store`` true, the default) live in the tenant's zone
as turns of the zone-bound conversation store, never at the edge: a
response's id names its conversation and so its zone and home region
(``resp_<zone>_<region>_<conversation>_<kind><random>``), and the turn's
request id is the response id. A response without ``previous_response_id``
or ``conversation`` starts a conversation of its own (titled with its id);
``previous_response_id`` continues that conversation after the previous
response's reply (a branch of its tree), so the region puts the previous
responses' stored input and output before the new input, fitted to the
model's window; ``conversation`` adds the turn to a conversation of
``/v1/conversations``. What the store keeps of a response's input are its
user text (several user messages joined) and its function call outputs:
``instructions``, system, developer and assistant input items reach the
model but are not kept, so a follow-up does not carry them (as OpenAI
does not carry ``instructions``). A retrieved response has its output,
usage, model and status; the request's sampling parameters are echoed only
when it is created. With ``store`` false nothing is kept: the response id
names nothing to retrieve, and ``previous_response_id`` sends the stored
thread's messages with the turn.

``DELETE`` removes the thread a response belongs to (the responses chained
to it by ``previous_response_id`` with it); a response added to a named
conversation is deleted with that conversation. An id that is malformed,
of another zone or of another tenant is a 404 ``response_not_found``.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.core.errors import MeshError, Reason
from llmmesh.core.ids import ConversationId
from llmmesh.edge.caller import authenticate
from llmmesh.edge.completions import CompletionsHandler
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.json_body import read_json
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.response_events import ResponsesFormat, ResponseShape, output_items, status_of
from llmmesh.edge.response_request import ResponseRequest, function_tools
from llmmesh.edge.route_headers import AUTO_MODELS
from llmmesh.edge.schemas import parse_body
from llmmesh.edge.settings import EdgeSettings
from llmmesh.v1 import chat_service_pb2, common_pb2

_TIMEOUT_S = 10.0
_STORED = re.compile(
    r"^resp_([a-z][a-z0-9]{0,15})_([a-z][a-z0-9-]{0,30})_([0-9a-f]{16,32})_([tc])[0-9a-f]{24}$"
)
# A stored thread longer than this many pages of messages is not sent whole with a stateless turn.
_MAX_PAGES = 20
_PAGE = 500
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass(frozen=True)
class StoredResponseId:
    """A stored response's id: its conversation and whether that is the
    response thread's own (``t``) or a conversation the client named (``c``)."""

    text: str
    conversation: ConversationId
    own_thread: bool

    @classmethod
    def new(cls, conversation: ConversationId, own_thread: bool) -> StoredResponseId:
        c = conversation
        kind = "t" if own_thread else "c"
        text = f"resp_{c.zone}_{c.home_region}_{c.token}_{kind}{secrets.token_hex(12)}"
        return cls(text, conversation, own_thread)

    @classmethod
    def parse(cls, text: str) -> StoredResponseId | None:
        match = _STORED.match(text)
        if match is None:
            return None
        conversation = ConversationId(match.group(1), match.group(2), match.group(3))
        return cls(text, conversation, match.group(4) == "t")


def not_found(response_id: str, param: str = "response_id") -> OpenAIError:
    code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param=param, code=code)


class ResponsesHandler:
    """Serves the Responses API through the chat path and the zone's conversation store."""

    def __init__(self, settings: EdgeSettings, mesh: MeshClient, completions: CompletionsHandler) -> None:
        self._settings = settings
        self._mesh = mesh
        self._completions = completions

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        req = parse_body(ResponseRequest, await read_json(request, self._settings.max_body_bytes))
        req.check_supported()
        options = req.turn_options()
        messages = req.messages()
        model = await self._mesh.models.resolve(req.model, principal.tenant.tier)
        auto = req.model in AUTO_MODELS
        start = chat_service_pb2.ChatStart(
            model="auto" if auto else model.name,
            messages=messages,
            sampling=options.to_sampling(),
            user=options.end_user(),
        )
        prefer_region = ""
        conversation: str | None = None
        if req.stored():
            response_id = await self._stored_turn(principal, req, start, "" if auto else model.name)
            start.request_id = response_id.text
            prefer_region = response_id.conversation.home_region
            if not response_id.own_thread:
                conversation = str(response_id.conversation)
        else:
            start.request_id = "resp_" + secrets.token_hex(24)
            if req.previous_response_id is not None:
                previous = self._stored_id(principal, req.previous_response_id, "previous_response_id")
                history = await self._thread(principal, previous)
                leading = [m for m in messages if m.role == common_pb2.CHAT_ROLE_SYSTEM]
                rest = [m for m in messages if m.role != common_pb2.CHAT_ROLE_SYSTEM]
                del start.messages[:]
                start.messages.extend([*leading, *history, *rest])
        shape = ResponseShape(_echo(req, conversation))
        try:
            return await self._completions.serve_turn(
                request,
                principal,
                start,
                "" if auto else model.name,
                stream=bool(req.stream),
                include_usage=False,
                prefer_region=prefer_region,
                reply_format=ResponsesFormat(shape),
            )
        except MeshError as err:
            if err.metadata.get("param") == "parent_message_id":
                raise not_found(req.previous_response_id or "", "previous_response_id") from err
            raise

    async def _stored_turn(
        self, principal: Principal, req: ResponseRequest, start: chat_service_pb2.ChatStart, model: str
    ) -> StoredResponseId:
        """Place ``start`` in the conversation store: after the previous
        response, in the named conversation, or in a new conversation of its own."""
        if req.previous_response_id is not None:
            previous = self._stored_id(principal, req.previous_response_id, "previous_response_id")
            reply = await self._reply(principal, previous, "previous_response_id")
            start.conversation_id = str(previous.conversation)
            start.parent_message_id = reply.id
            return StoredResponseId.new(previous.conversation, previous.own_thread)
        named = req.conversation_id()
        if named is not None:
            conversation = ConversationId.parse(named)
            if conversation is None or conversation.zone != principal.tenant.zone:
                raise OpenAIError(
                    404, f"Conversation with id '{named}' not found.", param="conversation", code="not_found"
                )
            start.conversation_id = named
            return StoredResponseId.new(conversation, own_thread=False)
        message = chat_service_pb2.CreateConversationRequest(model=model, title="response thread")
        created: chat_service_pb2.CreateConversationResponse = await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.CreateConversation(message, metadata=metadata, timeout=_TIMEOUT_S),
        )
        conversation = ConversationId.parse(created.conversation.id)
        assert conversation is not None, created.conversation.id
        start.conversation_id = created.conversation.id
        return StoredResponseId.new(conversation, own_thread=True)

    async def retrieve(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        if request.query_params.get("stream") not in (None, "false"):
            raise OpenAIError(
                400,
                "a stored response is read whole; resume a stream with GET /v1/streams/{id}",
                param="stream",
            )
        response_id = self._stored_id(principal, request.path_params["response_id"])
        stored = await self._messages(principal, response_id)
        reply = _assistant(stored)
        if reply is None:
            raise not_found(response_id.text)
        status, incomplete = status_of(reply.finish_reason)
        output = output_items(response_id.text, reply.content, list(reply.tool_calls), status)
        shape = ResponseShape(_stored_echo(None if response_id.own_thread else str(response_id.conversation)))
        usage = common_pb2.TokenUsage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens)
        body = shape.response(
            response_id.text,
            stored[0].create_time.seconds,
            reply.model,
            status=status,
            output=output,
            usage=usage,
            incomplete=incomplete,
        )
        return JSONResponse(body)

    async def delete(self, request: Request) -> Response:
        principal = await authenticate(request, self._mesh)
        response_id = self._stored_id(principal, request.path_params["response_id"])
        if _assistant(await self._messages(principal, response_id)) is None:
            raise not_found(response_id.text)
        if not response_id.own_thread:
            raise OpenAIError(
                400,
                "this response belongs to conversation "
                f"{response_id.conversation}: it is deleted with it (DELETE /v1/conversations/{{id}})",
                param="response_id",
                code="invalid_value",
            )
        message = chat_service_pb2.DeleteConversationRequest(conversation_id=str(response_id.conversation))
        await self._mesh.in_zone(
            principal,
            lambda stub, metadata: stub.DeleteConversation(message, metadata=metadata, timeout=_TIMEOUT_S),
            home_region=response_id.conversation.home_region,
        )
        return JSONResponse({"id": response_id.text, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        """The stored input items of a response, paged as OpenAI's lists
        (``order`` desc by default, ``limit``, ``after`` an item id)."""
        principal = await authenticate(request, self._mesh)
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise OpenAIError(400, "order must be asc or desc", param="order", code="invalid_value")
        if query.getlist("include"):
            raise OpenAIError(
                400, "'include': no extra fields are served", param="include", code="unsupported_parameter"
            )
        limit = _limit(query.get("limit"))
        response_id = self._stored_id(principal, request.path_params["response_id"])
        stored = await self._messages(principal, response_id)
        if _assistant(stored) is None:
            raise not_found(response_id.text)
        items = [_input_item(m) for m in stored if m.role != common_pb2.CHAT_ROLE_ASSISTANT]
        if order == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise OpenAIError(
                    400, "after must be the id of an item of this list", param="after", code="invalid_value"
                )
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    def _stored_id(self, principal: Principal, text: str, param: str = "response_id") -> StoredResponseId:
        parsed = StoredResponseId.parse(text)
        if parsed is None or parsed.conversation.zone != principal.tenant.zone:
            raise not_found(text, param)
        return parsed

    async def _messages(
        self, principal: Principal, response_id: StoredResponseId, param: str = "response_id"
    ) -> list[chat_service_pb2.StoredMessage]:
        """What the response's turn stored, oldest first; a 404 when its conversation is not the caller's."""
        message = chat_service_pb2.ListMessagesRequest(
            conversation_id=str(response_id.conversation), request_id=response_id.text, page_size=_PAGE
        )
        return list((await self._list(principal, message, response_id, param)).messages)

    async def _list(
        self,
        principal: Principal,
        message: chat_service_pb2.ListMessagesRequest,
        response_id: StoredResponseId,
        param: str,
    ) -> chat_service_pb2.ListMessagesResponse:
        """ListMessages in the response's conversation; a 404 naming ``param``
        when the conversation is not the caller's."""
        try:
            listed: chat_service_pb2.ListMessagesResponse = await self._mesh.in_zone(
                principal,
                lambda stub, metadata: stub.ListMessages(message, metadata=metadata, timeout=_TIMEOUT_S),
                home_region=response_id.conversation.home_region,
            )
        except MeshError as err:
            if err.reason in (Reason.CONVERSATION_NOT_FOUND, Reason.MESSAGE_NOT_FOUND):
                raise not_found(response_id.text, param) from err
            raise
        return listed

    async def _reply(
        self, principal: Principal, response_id: StoredResponseId, param: str
    ) -> chat_service_pb2.StoredMessage:
        reply = _assistant(await self._messages(principal, response_id, param))
        if reply is None:
            raise not_found(response_id.text, param)
        return reply

    async def _thread(self, principal: Principal, previous: StoredResponseId) -> list[common_pb2.ChatMessage]:
        """The stored messages up to the previous response's reply, as chat messages."""
        reply = await self._reply(principal, previous, "previous_response_id")
        out: list[common_pb2.ChatMessage] = []
        token = ""
        for _ in range(_MAX_PAGES):
            message = chat_service_pb2.ListMessagesRequest(
                conversation_id=str(previous.conversation),
                leaf_id=reply.id,
                page_size=_PAGE,
                page_token=token,
            )
            page = await self._list(principal, message, previous, "previous_response_id")
            out.extend(
                common_pb2.ChatMessage(
                    role=m.role, content=m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id
                )
                for m in page.messages
                if m.role != common_pb2.CHAT_ROLE_SYSTEM
            )
            token = page.next_page_token
            if not token:
                return out
        raise OpenAIError(
            400,
            "the previous responses are too long to send with an unstored response; store it",
            param="previous_response_id",
            code="invalid_value",
        )


def _assistant(messages: list[chat_service_pb2.StoredMessage]) -> chat_service_pb2.StoredMessage | None:
    return next((m for m in reversed(messages) if m.role == common_pb2.CHAT_ROLE_ASSISTANT), None)


def _input_item(message: chat_service_pb2.StoredMessage) -> dict[str, object]:
    if message.role == common_pb2.CHAT_ROLE_TOOL:
        return {
            "id": message.id,
            "type": "function_call_output",
            "status": "completed",
            "call_id": message.tool_call_id,
            "output": message.content,
        }
    role = common_pb2.ChatRole.Name(message.role).removeprefix("CHAT_ROLE_").lower()
    return {
        "id": message.id,
        "type": "message",
        "status": "completed",
        "role": role,
        "content": [{"type": "input_text", "text": message.content}],
    }


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise OpenAIError(
            400, f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit", code="invalid_value"
        )
    return int(text)


def _stored_echo(conversation: str | None) -> dict[str, object]:
    """What a stored response read back echoes: its request's parameters are not kept."""
    return {
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": None,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "user": None,
        "service_tier": "default",
        "background": False,
        "conversation": {"id": conversation} if conversation else None,
    }


def _echo(req: ResponseRequest, conversation: str | None) -> dict[str, object]:
    """The request's parameters as a created response echoes them."""
    fmt: object = {"type": "text"}
    if req.text is not None and req.text.format is not None:
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True)
    tools = [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": bool(t.strict),
        }
        for t in function_tools(req.tools or [])
    ]
    echo = _stored_echo(conversation)
    echo.update(
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        store=req.stored(),
        temperature=req.temperature,
        text={"format": fmt, "verbosity": (req.text.verbosity if req.text else None) or "medium"},
        tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
        tools=tools,
        top_p=req.top_p,
        user=req.user,
    )
    if req.safety_identifier is not None:
        echo["safety_identifier"] = req.safety_identifier
    return echo
