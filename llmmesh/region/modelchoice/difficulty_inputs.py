"""What the model router reads besides the request: the tenant's budget
and a conversation's stored history, each behind a callable so that the
router itself needs neither the quota ledger nor the zone store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from llmmesh.core.errors import MeshError
from llmmesh.region.admission.quota import QuotaLedger
from llmmesh.region.policy_cache import Caller
from llmmesh.region.zone_store.rows import Role
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import chat_service_pb2

BudgetLeft = Callable[[Caller], Awaitable[float | None]]
"""The share of a caller's tenant's monthly quota left; None without a quota."""


HistorySize = Callable[[Caller, chat_service_pb2.ChatStart], Awaitable[tuple[int, int]]]
"""A turn's stored conversation history: its characters and user messages ((0, 0) for none)."""


def stored_history(store: ZoneStore) -> HistorySize:
    """:data:`HistorySize` read from the zone store: every stored message of
    the conversation counts (all its branches: an estimate from above)."""

    async def size(caller: Caller, start: chat_service_pb2.ChatStart) -> tuple[int, int]:
        if not start.conversation_id:
            return 0, 0
        try:
            rows = await store.messages(caller.tenant_id, start.conversation_id)
        except MeshError:
            return 0, 0  # the turn itself is refused further on, with the store's error
        return sum(len(r.content) for r in rows), sum(1 for r in rows if r.role == Role.USER)

    return size


async def no_history(_caller: Caller, _start: chat_service_pb2.ChatStart) -> tuple[int, int]:
    """No history: a turn outside a conversation, or a router that does not look."""
    return 0, 0


def quota_budget(ledger: QuotaLedger) -> BudgetLeft:
    """:data:`BudgetLeft` read from the region's quota ledger."""

    async def left(caller: Caller) -> float | None:
        quota = caller.tenant.monthly_token_quota
        if quota <= 0:
            return None
        return max(0.0, 1.0 - await ledger.used(caller.tenant_id) / quota)

    return left
