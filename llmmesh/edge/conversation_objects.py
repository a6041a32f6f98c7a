"""The conversations API's request bodies and the objects it answers with,
in OpenAI's shapes: ``conversation``, ``conversation.deleted``,
``conversation.message`` and ``list`` (``data``, ``first_id``, ``last_id``,
``has_more``); times are unix seconds.

The objects are pydantic models so that the OpenAPI document describes
exactly what the handlers send.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from llmmesh.edge.chunks import FINISH_REASONS
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.retrieval_options import RetrievalOptions
from llmmesh.edge.schemas import Message, ModelName, TextPart, TurnOptions
from llmmesh.v1 import chat_service_pb2, common_pb2


def _storable(text: str) -> str:
    # The zone store keeps UTF-8 text: a lone surrogate cannot be encoded, and
    # PostgreSQL refuses NUL in text.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid UTF-8 text") from exc
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


StoredText = Annotated[StrictStr, AfterValidator(_storable)]
"""Text that a conversation stores."""

ItemId = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
"""The id of a stored message, as the mesh issues them."""

ClientMessageId = Annotated[StrictStr, Field(pattern=r"^[\x21-\x7e]{1,255}$")]
"""A client's own id of a message: 1 to 255 printable ASCII characters, no spaces."""


class IdempotentTurn(TurnOptions):
    """A turn that a client may retry safely."""

    llmmesh_retrieval: RetrievalOptions | None = Field(
        default=None,
        description="Vector stores whose excerpts join the turn's context, cited in the reply "
        "(as on chat completions; a regeneration searches with the question it answers again).",
    )

    client_message_id: ClientMessageId | None = Field(
        default=None,
        description="The client's own id of this turn (as the Idempotency-Key header): a retry with "
        "the same id makes no second turn and answers with the stored reply.",
    )


class CreateConversationRequest(BaseModel):
    """``POST /v1/conversations``: every field optional."""

    model_config = ConfigDict(extra="forbid")
    model: ModelName | None = Field(
        default=None, description='The model of its turns; absent or "auto" follows the tier\'s default.'
    )
    title: StoredText | None = Field(default=None, description="A display title.")
    system_prompt: StoredText | None = Field(
        default=None, description="Put before every turn unless the turn brings its own system message."
    )


class ConversationMessageRequest(IdempotentTurn):
    """``POST /v1/conversations/{conversation_id}/messages``: the next user
    message (``content``) or messages (``messages``); the region puts the
    stored history before them and stores the turn. They follow the newest
    message (the current branch) unless ``parent_id`` names another stored
    message to continue after, or ``edit_id`` a stored user message they are
    a new version of (a new branch)."""

    model_config = ConfigDict(extra="forbid")
    content: StrictStr | list[TextPart] | None = Field(default=None, description="The user's new message.")
    messages: Annotated[list[Message], Field(min_length=1)] | None = Field(
        default=None,
        description="New messages instead of content; at least one from the user or a tool.",
    )
    model: ModelName | None = Field(
        default=None, description="Overrides the conversation's model for this turn."
    )
    parent_id: ItemId | None = Field(
        default=None, description="Continue after this stored message, whichever branch it is on."
    )
    edit_id: ItemId | None = Field(
        default=None,
        description="The stored user message this one is a new version of: a sibling of it, a new branch.",
    )

    def new_messages(self) -> list[common_pb2.ChatMessage]:
        """The turn's new messages; a 400 unless exactly one of ``content`` and
        ``messages`` is given, a user or a tool speaks and every text can be
        stored."""
        if (self.content is None) == (self.messages is None):
            raise OpenAIError(
                400,
                "give the new message as 'content' or as 'messages', not both and not neither",
                param="content",
                code="invalid_value",
            )
        if self.messages is None:
            messages, param = [Message(role="user", content=self.content)], "content"
        else:
            # A turn answers the user, or goes on from the results of the
            # tools the last reply called.
            if not any(m.role in ("user", "tool") for m in self.messages):
                raise OpenAIError(
                    400,
                    "messages must hold at least one user or tool message",
                    param="messages",
                    code="invalid_value",
                )
            messages, param = self.messages, "messages"
        out = []
        for i, message in enumerate(messages):
            where = f"{param}[{i}]"
            field = "content" if self.messages is None else f"{where}.content"
            converted = message.to_proto(where, field)
            try:
                _storable(converted.content)
            except ValueError as exc:
                raise OpenAIError(400, f"{field} {exc}", param=field, code="invalid_value") from exc
            out.append(converted)
        return out


class RegenerateRequest(IdempotentTurn):
    """``POST /v1/conversations/{conversation_id}/messages/{message_id}/regenerate``:
    a new reply in place of a stored assistant message (or to a stored user
    message), a new branch; the question is not sent again."""

    model_config = ConfigDict(extra="forbid")
    model: ModelName | None = Field(
        default=None, description="Overrides the conversation's model for this turn."
    )


class BranchObject(BaseModel):
    """One branch of a conversation: the path from its first message to
    ``leaf_id``. ``GET .../messages?leaf_id=`` lists it; a message sent with
    ``parent_id`` set to ``leaf_id`` continues it."""

    id: str = Field(description="The leaf's id.")
    object: Literal["conversation.branch"] = "conversation.branch"
    leaf_id: str
    message_count: int
    fork_id: str | None = Field(description="The last message it shares with an older branch, if any.")
    updated_at: int
    current: bool = Field(description="Whether a message sent without parent_id continues it.")

    @classmethod
    def of(cls, branch: chat_service_pb2.Branch) -> BranchObject:
        return cls(
            id=branch.leaf_id,
            leaf_id=branch.leaf_id,
            message_count=branch.message_count,
            fork_id=branch.fork_id or None,
            updated_at=branch.update_time.seconds,
            current=branch.current,
        )


def turn_context_headers(started: chat_service_pb2.ChatStarted) -> dict[str, str]:
    """What a conversation turn's answer says of its place and its history:
    the message it follows, and how many old turns a summary stood for and
    how many messages were left out to fit the window. None for other turns."""
    if not started.conversation_id:
        return {}
    headers = {
        "x-llmmesh-context-summarised-turns": str(started.context.summarised_turns),
        "x-llmmesh-context-dropped-messages": str(started.context.dropped_messages),
    }
    if started.parent_message_id:
        headers["x-llmmesh-parent-message-id"] = started.parent_message_id
    return headers


class ConversationObject(BaseModel):
    """A conversation. ``zone`` and ``home_region`` say where it is stored."""

    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    updated_at: int
    title: str
    model: str
    system_prompt: str
    zone: str
    home_region: str

    @classmethod
    def of(cls, conversation: chat_service_pb2.Conversation) -> ConversationObject:
        return cls(
            id=conversation.id,
            created_at=conversation.create_time.seconds,
            updated_at=conversation.update_time.seconds,
            title=conversation.title,
            model=conversation.model,
            system_prompt=conversation.system_prompt,
            zone=conversation.zone,
            home_region=conversation.home_region,
        )


class DeletedConversationObject(BaseModel):
    """The answer to a delete."""

    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


Role = Literal["system", "developer", "user", "assistant", "tool"]
"""Who wrote a stored message."""


class MessageUsage(BaseModel):
    """Token counts of the turn that wrote an assistant message."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCallObject(BaseModel):
    """The function a tool call calls."""

    name: str
    arguments: str = Field(description="The arguments as JSON text.")


class ToolCallObject(BaseModel):
    """One tool call of a stored assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallObject

    @classmethod
    def of(cls, call: common_pb2.ToolCall) -> ToolCallObject:
        return cls(id=call.id, function=FunctionCallObject(name=call.name, arguments=call.arguments))


class MessageObject(BaseModel):
    """One stored message. The turn's figures (``model``, ``finish_reason``,
    ``usage``, ``cost_usd``) are set on assistant messages only."""

    id: str
    object: Literal["conversation.message"] = "conversation.message"
    created_at: int
    conversation_id: str
    role: Role
    content: str
    request_id: str | None
    model: str | None
    finish_reason: str | None
    usage: MessageUsage | None
    cost_usd: str | None = Field(description="An exact decimal string.")
    tool_calls: list[ToolCallObject] | None = Field(
        default=None, description="The tool calls of an assistant message that made any."
    )
    tool_call_id: str | None = Field(default=None, description="Of a tool message: the call it answers.")
    parent_id: str | None = Field(
        default=None, description="The message it follows in the conversation's tree; null for a first one."
    )

    @classmethod
    def of(cls, message: chat_service_pb2.StoredMessage) -> MessageObject:
        role = _ROLES.get(message.role, "user")
        reply = role == "assistant"
        usage = MessageUsage(
            prompt_tokens=message.input_tokens,
            completion_tokens=message.output_tokens,
            total_tokens=message.input_tokens + message.output_tokens,
        )
        return cls(
            id=message.id,
            created_at=message.create_time.seconds,
            conversation_id=message.conversation_id,
            role=role,
            content=message.content,
            request_id=message.request_id or None,
            model=message.model or None if reply else None,
            finish_reason=FINISH_REASONS.get(message.finish_reason) if reply else None,
            usage=usage if reply else None,
            cost_usd=message.cost_usd or None if reply else None,
            tool_calls=[ToolCallObject.of(c) for c in message.tool_calls] or None,
            tool_call_id=message.tool_call_id or None,
            parent_id=message.parent_id or None,
        )


_ROLES: dict[int, Role] = {
    common_pb2.CHAT_ROLE_SYSTEM: "system",
    common_pb2.CHAT_ROLE_DEVELOPER: "developer",
    common_pb2.CHAT_ROLE_USER: "user",
    common_pb2.CHAT_ROLE_ASSISTANT: "assistant",
    common_pb2.CHAT_ROLE_TOOL: "tool",
}

Item = TypeVar("Item", ConversationObject, MessageObject, BranchObject)


class ListObject(BaseModel, Generic[Item]):
    """One page of a list; the next starts ``after`` its ``last_id``."""

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def page(cls, data: Sequence[Item], has_more: bool) -> ListObject[Item]:
        return cls(
            data=list(data),
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )
