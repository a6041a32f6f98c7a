"""What the zone store hands out and takes in: conversations, messages, turns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import NamedTuple


class Role(StrEnum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ToolCallRow:
    """One tool call of an assistant message: its id, the function, the arguments' JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    """A tool message a turn sends: the id of the call it answers, and what the tool said."""

    tool_call_id: str
    content: str


@dataclass(frozen=True)
class ConversationRow:
    """A conversation, without its messages."""

    id: str
    tenant_id: str
    zone: str
    home_region: str
    model: str
    title: str
    created_at: datetime
    updated_at: datetime
    system_prompt: str = ""


@dataclass(frozen=True)
class SummaryRow:
    """A stored summary of a branch's first ``turns`` whole turns, through
    message ``through_message_id`` (every branch through it can use it)."""

    conversation_id: str
    through_message_id: str
    turns: int
    content: str
    model: str
    created_at: datetime


@dataclass(frozen=True)
class ConversationPage:
    """One page of a tenant's conversations, newest first; the token is empty on the last page."""

    items: list[ConversationRow]
    next_page_token: str = ""


@dataclass(frozen=True)
class MessageRow:
    """One message of a conversation; counts, cost, model and finish reason are the assistant's
    (zero and empty on other roles), as are its tool calls; ``tool_call_id``
    is a tool message's (the call it answers)."""

    id: str
    conversation_id: str
    seq: int
    role: Role
    content: str
    request_id: str | None
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cost_usd: Decimal
    model: str
    finish_reason: str
    created_at: datetime
    tool_calls: tuple[ToolCallRow, ...] = ()
    tool_call_id: str = ""
    # The message it follows in the conversation's tree; "" for a first message.
    parent_id: str = ""


@dataclass(frozen=True)
class AssistantMessage:
    """The reply a turn produced and what it cost.

    ``finish_reason`` is a short name such as ``FINISH_REASON_STOP``
    (``common_pb2.FinishReason.Name``).
    """

    content: str
    model: str
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    tool_calls: tuple[ToolCallRow, ...] = ()


@dataclass(frozen=True)
class ContinuedTurn:
    """The part of a turn that another region delivered before it failed,
    as the region continuing the turn records it.

    ``request_id`` is the original turn's; ``input_tokens`` its prompt
    (billed once, with the original request id); ``output_tokens`` and
    ``text`` what the client had received when the stream broke.
    """

    request_id: str
    input_tokens: int
    output_tokens: int
    text: str


@dataclass(frozen=True)
class TurnRecord:
    """What :meth:`ZoneStore.record_turn` left in the store.

    ``duplicate`` is true when the request id was recorded before (the call
    changed nothing). ``messages`` are the turn's messages, stored now or
    before; empty for a turn without a live conversation of the tenant.
    """

    request_id: str
    duplicate: bool
    messages: tuple[MessageRow, ...]


@dataclass(frozen=True)
class QuotaCheck:
    """A tenant's monthly token quota, checked zone-wide as a turn is
    accepted (:mod:`region.zone_store.turn_starts`): ``limit`` tokens in the
    month that began at ``month_start``, of which billing counted ``billed``
    when it was asked at ``billed_at`` (None: never answered this month, so
    every usage row of the month in the zone counts)."""

    limit: int
    month_start: datetime
    billed: int = 0
    billed_at: datetime | None = None


@dataclass(frozen=True)
class TurnStart:
    """A turn as its region accepts it, before any engine work: the
    "started" marker the zone store keeps for every request id.

    ``prompt_tokens`` and ``max_output_tokens`` are what the turn reserved
    against its key's limits; ``holder`` names this acceptance (a fresh
    random token each time). A continuation names its original request id
    in ``continues`` and the output tokens it carries in ``carried_tokens``.
    """

    request_id: str
    tenant_id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    holder: str
    continues: str | None = None
    carried_tokens: int = 0
    quota: QuotaCheck | None = None
    """The tenant's quota, for a turn of its own (a continuation's turn was checked)."""


@dataclass(frozen=True)
class AcceptedTurn:
    """What the zone store knows of an accepted turn's past: for a
    continuation, the prompt its original turn already counted against the
    key's limits (0 for a turn of its own)."""

    counted_prompt_tokens: int = 0


class UsageKey(NamedTuple):
    """A usage row's key: request ids are a namespace per tenant."""

    tenant_id: str
    request_id: str


class PendingUsage(NamedTuple):
    """A usage row not shipped to billing yet: its key and its serialized ``UsageRecord``."""

    tenant_id: str
    request_id: str
    usage: bytes

    @property
    def key(self) -> UsageKey:
        return UsageKey(self.tenant_id, self.request_id)
