"""Summaries of long conversation branches, written by a model in the zone.

When a branch's history no longer fits the model's window, the context
builder drops its oldest whole turns. With summaries, those turns are not
lost: after the turn, :class:`Summaries` asks the region's smallest chat
model (through the region's own engine pods) to summarise them, folding in
the summary before it, and stores the result in the zone store through the
branch's last summarised message. Later turns on any branch through that
message put the summary in place of the turns it covers; as the branch
grows, a newer summary covering more turns replaces it.

A summary is billed to the tenant as background work, within its limits
(:mod:`region.lifecycle.background_usage`): one its limits leave no room
for is not written. Its text never leaves the zone: the model runs on the
region's pods and the summary is stored in the zone store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from llmmesh.core.tasks import cancel_and_wait
from llmmesh.region.zone_store.rows import MessageRow, Role, SummaryRow
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import common_pb2

log = logging.getLogger(__name__)

Complete = Callable[[str, str, list[tuple[str, str]], int], Awaitable[str | None]]
"""Asks, for a tenant (first argument), model ``model`` (second) for a greedy
completion of (role, text) messages with at most the given output tokens;
None when the tenant's limits leave no room for it."""

INSTRUCTIONS = (
    "Summarise the conversation below for the assistant that will continue it. "
    "Keep names, numbers, decisions, open questions and what the user wants. "
    "Write plain sentences, no preamble."
)
SUMMARY_PREFIX = "Summary of the earlier part of this conversation: "


@dataclass(frozen=True)
class SummaryPlan:
    """What a refresh summarises: the branch's first ``turns`` whole turns,
    the last of which ends at ``through_message_id``, and the summary it folds in."""

    tenant_id: str
    conversation_id: str
    through_message_id: str
    turns: int
    transcript: list[MessageRow]
    previous: SummaryRow | None


def turn_starts(rows: Sequence[MessageRow]) -> list[int]:
    """Where each whole turn of a branch begins: at each user message (and at 0)."""
    starts = [i for i, row in enumerate(rows) if row.role == Role.USER and i > 0]
    return [0, *starts] if rows else []


def summary_message(summary: SummaryRow) -> common_pb2.ChatMessage:
    """A stored summary as the system message that stands for the turns it covers."""
    return common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content=SUMMARY_PREFIX + summary.content)


class Summaries:
    """Reads the summary a branch can use and refreshes it in the background."""

    def __init__(
        self,
        store: ZoneStore,
        complete: Complete,
        model: Callable[[], Awaitable[str]],
        *,
        max_tokens: int = 256,
        max_input_chars: int = 16_000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``model`` names the model to summarise with when a refresh runs
        (the region's smallest chat model); ``max_input_chars`` bounds the
        transcript sent to it (its newest part is kept)."""
        self._store = store
        self._complete = complete
        self._model = model
        self._max_tokens = max_tokens
        self._max_input_chars = max_input_chars
        self._clock = clock
        # One refresh per conversation at a time; a later ask while one runs is dropped.
        self._running: dict[str, asyncio.Task[None]] = {}

    async def for_branch(
        self, tenant_id: str, conversation_id: str, branch: Sequence[MessageRow]
    ) -> SummaryRow | None:
        """The stored summary covering the most turns of ``branch``."""
        return await self._store.branch_summary(tenant_id, conversation_id, [row.id for row in branch])

    def refresh(
        self, tenant_id: str, conversation_id: str, branch: Sequence[MessageRow], turns: int
    ) -> asyncio.Task[None] | None:
        """Summarise the first ``turns`` whole turns of ``branch`` in the
        background, unless a refresh of the conversation is running; the task."""
        if conversation_id in self._running or turns <= 0:
            return None
        task = asyncio.create_task(self._refresh(tenant_id, conversation_id, list(branch), turns))
        self._running[conversation_id] = task
        task.add_done_callback(lambda _: self._running.pop(conversation_id, None))
        return task

    async def close(self) -> None:
        """Stop the refreshes still running."""
        for task in list(self._running.values()):
            await cancel_and_wait(task)

    async def _refresh(
        self, tenant_id: str, conversation_id: str, branch: list[MessageRow], turns: int
    ) -> None:
        try:
            plan = await self._plan(tenant_id, conversation_id, branch, turns)
            if plan is None:
                return
            model = await self._model()
            text = await self._complete(tenant_id, model, self._prompt(plan), self._max_tokens)
            if text is None:
                return  # the tenant's limits left no room: the history is cut as before
            if not text.strip():
                log.warning("conversation %s: the summary model wrote nothing", conversation_id)
                return
            summary = SummaryRow(
                conversation_id, plan.through_message_id, plan.turns, text.strip(), model, self._clock()
            )
            await self._store.save_summary(tenant_id, summary)
            log.info("conversation %s: %d turns summarised by %s", conversation_id, plan.turns, model)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The turn itself is done; without a summary, history is cut as before.
            log.exception("conversation %s: the summary could not be refreshed", conversation_id)

    async def _plan(
        self, tenant_id: str, conversation_id: str, branch: list[MessageRow], turns: int
    ) -> SummaryPlan | None:
        starts = turn_starts(branch)
        turns = min(turns, len(starts))
        if turns <= 0:
            return None
        end = starts[turns] if turns < len(starts) else len(branch)
        previous = await self.for_branch(tenant_id, conversation_id, branch[:end])
        if previous is not None and previous.turns >= turns:
            return None  # already covered
        begin = 0
        if previous is not None:
            covered = next(i for i, row in enumerate(branch) if row.id == previous.through_message_id)
            begin = covered + 1
        return SummaryPlan(tenant_id, conversation_id, branch[end - 1].id, turns, branch[begin:end], previous)

    def _prompt(self, plan: SummaryPlan) -> list[tuple[str, str]]:
        lines = [f"{row.role}: {row.content}" for row in plan.transcript if row.content]
        transcript = "\n".join(lines)[-self._max_input_chars :]
        if plan.previous is not None:
            transcript = f"(Summary so far: {plan.previous.content})\n{transcript}"
        return [("system", INSTRUCTIONS), ("user", transcript)]
