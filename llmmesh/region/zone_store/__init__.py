"""The zone-bound conversation store: content that never leaves its zone, and the durable usage outbox."""

from llmmesh.region.zone_store.rows import (
    AcceptedTurn,
    AssistantMessage,
    ConversationPage,
    ConversationRow,
    MessageRow,
    PendingUsage,
    QuotaCheck,
    Role,
    SummaryRow,
    ToolCallRow,
    ToolResult,
    TurnRecord,
    TurnStart,
    UsageKey,
)
from llmmesh.region.zone_store.store import ZoneStore

__all__ = [
    "AcceptedTurn",
    "AssistantMessage",
    "ConversationPage",
    "ConversationRow",
    "MessageRow",
    "PendingUsage",
    "QuotaCheck",
    "Role",
    "SummaryRow",
    "ToolCallRow",
    "ToolResult",
    "TurnRecord",
    "TurnStart",
    "UsageKey",
    "ZoneStore",
]
