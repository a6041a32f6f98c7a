"""The zone-bound conversation store: content that never leaves its zone, and the durable usage outbox."""

from region.zone_store.rows import (
    AssistantMessage,
    ConversationPage,
    ConversationRow,
    MessageRow,
    Role,
    TurnRecord,
)
from region.zone_store.store import ZoneStore

__all__ = [
    "AssistantMessage",
    "ConversationPage",
    "ConversationRow",
    "MessageRow",
    "Role",
    "TurnRecord",
    "ZoneStore",
]
