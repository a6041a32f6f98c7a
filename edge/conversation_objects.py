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

from edge.chunks import FINISH_REASONS
from edge.errors import OpenAIError
from edge.schemas import Message, ModelName, TextPart, TurnOptions, chat_messages
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


class ConversationMessageRequest(TurnOptions):
    """``POST /v1/conversations/{conversation_id}/messages``: the next user
    message (``content``) or messages (``messages``); the region puts the
    stored history before them and stores the turn."""

    model_config = ConfigDict(extra="forbid")
    content: StrictStr | list[TextPart] | None = Field(default=None, description="The user's new message.")
    messages: Annotated[list[Message], Field(min_length=1)] | None = Field(
        default=None, description="New messages instead of content; at least one from the user."
    )
    model: ModelName | None = Field(
        default=None, description="Overrides the conversation's model for this turn."
    )

    def new_messages(self) -> list[common_pb2.ChatMessage]:
        """The turn's new messages; a 400 unless exactly one of ``content`` and
        ``messages`` is given, a user speaks and every text can be stored."""
        if (self.content is None) == (self.messages is None):
            raise OpenAIError(
                400,
                "give the new message as 'content' or as 'messages', not both and not neither",
                param="content",
                code="invalid_value",
            )
        if self.messages is None:
            messages, params = [Message(role="user", content=self.content)], ["content"]
        else:
            if not any(m.role == "user" for m in self.messages):
                raise OpenAIError(
                    400,
                    "messages must hold at least one user message",
                    param="messages",
                    code="invalid_value",
                )
            messages, params = self.messages, [f"messages[{i}].content" for i in range(len(self.messages))]
        for message, param in zip(messages, params, strict=True):
            try:
                _storable(message.text())
            except ValueError as exc:
                raise OpenAIError(400, f"{param} {exc}", param=param, code="invalid_value") from exc
        return chat_messages(messages)


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


class MessageUsage(BaseModel):
    """Token counts of the turn that wrote an assistant message."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class MessageObject(BaseModel):
    """One stored message. The turn's figures (``model``, ``finish_reason``,
    ``usage``, ``cost_usd``) are set on assistant messages only."""

    id: str
    object: Literal["conversation.message"] = "conversation.message"
    created_at: int
    conversation_id: str
    role: Literal["system", "user", "assistant"]
    content: str
    request_id: str | None
    model: str | None
    finish_reason: str | None
    usage: MessageUsage | None
    cost_usd: str | None = Field(description="An exact decimal string.")

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
        )


_ROLES: dict[int, Literal["system", "user", "assistant"]] = {
    common_pb2.CHAT_ROLE_SYSTEM: "system",
    common_pb2.CHAT_ROLE_USER: "user",
    common_pb2.CHAT_ROLE_ASSISTANT: "assistant",
}

Item = TypeVar("Item", ConversationObject, MessageObject)


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
