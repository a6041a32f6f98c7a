"""A conversation turn's context: where its messages go in the conversation's
tree, and the history the engine sees, fitted into the model's window.

A turn names at most one branch point (``ChatStart.branch_point``):

- none: it continues the current branch (the one ending at the newest
  message); its messages are stored after whatever is newest when it ends;
- ``parent_message_id``: it continues after that message, whichever branch
  it is on;
- ``edit_message_id``: its user message is a new version of that stored
  user message (a sibling of it), so the history is what preceded it;
- ``regenerate_message_id``: a new reply in place of that stored assistant
  message (a sibling of it), or to that stored user or tool message; the
  turn brings no messages: the stored question is sent again, and stored
  once.

History follows the chosen branch only. A continuation's prompt is its
original turn's, without what that turn stored. When the branch no longer
fits the window, its oldest turns are replaced by the branch's stored
summary (:mod:`region.lifecycle.summaries`) where one exists, and a summary covering
what was left out is refreshed after the turn; the turn's
:class:`ContextReport` says how many turns the summary stood for and how
many messages were left out.

The mesh's own context for the turn (``lead``: retrieval excerpts, the end
user's remembered facts) follows the system messages and is kept whole when
history is fitted; :func:`turn_question` names the user text a turn asks,
also when a regeneration asks a stored question again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from llmmesh.core.errors import InvalidArgument, NotFound, Reason
from llmmesh.region.lifecycle.summaries import Summaries, summary_message
from llmmesh.region.turn.context_builder import FittedContext, TokenCounter, fit_context, split_turns
from llmmesh.region.turn.history import history_messages, tool_results
from llmmesh.region.turn.tool_validation import require_answered_calls
from llmmesh.region.zone_store.rows import ConversationRow, MessageRow, Role, ToolResult
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.region.zone_store.tree import current_leaf, path_to
from llmmesh.v1 import chat_service_pb2, common_pb2


@dataclass(frozen=True)
class ConversationContext:
    """What a conversation turn sends and stores."""

    conversation_id: str
    # System messages, the history kept, then the new messages.
    messages: tuple[common_pb2.ChatMessage, ...]
    # The new user text stored with the reply (None: no new user message).
    user_text: str | None
    # The tool messages stored with the reply.
    tool_results: tuple[ToolResult, ...]
    # The message the turn's first new message follows; None: the newest one when it is stored.
    parent_id: str | None
    # The message the turn follows as it began ("" for a first message), reported in ChatStarted.
    follows: str
    # How the history was fitted.
    report: chat_service_pb2.ContextReport


@dataclass(frozen=True)
class _Branching:
    """The stored history a turn follows and the messages it sends anew."""

    history: list[MessageRow]
    parent_id: str | None
    follows: str
    resend: list[MessageRow]


def check_branch_point(start: chat_service_pb2.ChatStart) -> None:
    """INVALID_ARGUMENT for a branch point outside a conversation, and for a
    regeneration that brings messages (it answers stored ones)."""
    point = start.WhichOneof("branch_point")
    if point is None:
        return
    if not start.conversation_id:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"{point} needs a conversation_id", metadata={"param": point}
        )
    if point == "regenerate_message_id" and start.messages:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "a regeneration brings no messages: it answers the stored ones again",
            metadata={"param": "messages"},
        )


async def conversation_context(
    store: ZoneStore,
    tenant_id: str,
    start: chat_service_pb2.ChatStart,
    *,
    continues: str,
    window_tokens: int,
    reserve_output_tokens: int,
    count_tokens: TokenCounter,
    summaries: Summaries | None = None,
    lead: Sequence[common_pb2.ChatMessage] = (),
) -> ConversationContext:
    """The context of ``start``'s turn in its conversation (NOT_FOUND when
    the tenant has no such live conversation), fitted into ``window_tokens``
    (0: no window, everything is sent), with ``summaries`` standing for
    what does not fit (none: it is left out) and ``lead`` put after the
    system messages."""
    check_branch_point(start)
    conversation = await store.get_conversation(tenant_id, start.conversation_id)
    rows = await store.messages(tenant_id, conversation.id)
    branching = _branching(rows, start)
    system = [m for m in start.messages if m.role == common_pb2.CHAT_ROLE_SYSTEM] or _system(conversation)
    system = [*system, *lead]
    new = [m for m in start.messages if m.role != common_pb2.CHAT_ROLE_SYSTEM]
    history = history_messages(branching.history, continues)
    resent = history_messages(branching.resend, continues)
    require_answered_calls(history, [*resent, *new])
    asked = [m.content for m in new if m.role == common_pb2.CHAT_ROLE_USER]
    report = chat_service_pb2.ContextReport()
    if window_tokens:

        async def fit(
            lead: Sequence[common_pb2.ChatMessage], past: list[common_pb2.ChatMessage]
        ) -> FittedContext:
            return await fit_context(
                lead,
                past,
                [*resent, *new],
                window_tokens=window_tokens,
                reserve_output_tokens=reserve_output_tokens,
                count_tokens=count_tokens,
            )

        fitted = await fit(system, history)
        if fitted.dropped_messages and summaries is not None:
            fitted = await _summarised(
                summaries,
                tenant_id,
                conversation.id,
                branching.history,
                fitted,
                continues,
                system,
                fit,
                report,
            )
        messages = fitted.messages
        report.dropped_messages = fitted.dropped_messages
    else:
        messages = (*system, *history, *resent, *new)
    return ConversationContext(
        conversation.id,
        tuple(messages),
        "\n\n".join(asked) if asked else None,
        tool_results(new),
        branching.parent_id,
        branching.follows,
        report,
    )


async def turn_question(store: ZoneStore, tenant_id: str, start: chat_service_pb2.ChatStart) -> str:
    """The user text ``start``'s conversation turn asks: its last new user
    message, or for a turn that brings none (a regeneration), the stored
    one it answers again ("" when there is none)."""
    said = [m.content for m in start.messages if m.role == common_pb2.CHAT_ROLE_USER]
    if said or start.WhichOneof("branch_point") != "regenerate_message_id":
        return said[-1] if said else ""
    rows = await store.messages(tenant_id, start.conversation_id)
    resent = _branching(rows, start).resend
    return next((row.content for row in reversed(resent) if row.role == Role.USER), "")


def _system(conversation: ConversationRow) -> list[common_pb2.ChatMessage]:
    if not conversation.system_prompt:
        return []
    return [common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_SYSTEM, content=conversation.system_prompt)]


def _branching(rows: Sequence[MessageRow], start: chat_service_pb2.ChatStart) -> _Branching:
    point = start.WhichOneof("branch_point")
    by_id = {row.id: row for row in rows}
    if point is None:
        leaf = current_leaf(rows)
        return _Branching(path_to(rows, leaf), None, leaf, [])
    target_id = getattr(start, point)
    target = by_id.get(target_id)
    if target is None:
        if point == "regenerate_message_id":
            raise NotFound(
                Reason.MESSAGE_NOT_FOUND,
                f"message {target_id!r} is not a message of conversation {start.conversation_id!r}",
                metadata={"param": point, "message_id": target_id},
            )
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"{point} {target_id!r} is not a message of conversation {start.conversation_id!r}",
            metadata={"param": point},
        )
    if point == "parent_message_id":
        return _Branching(path_to(rows, target.id), target.id, target.id, [])
    if point == "edit_message_id":
        if target.role != Role.USER:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"message {target_id!r} is a {target.role} message; only a user message can be edited",
                metadata={"param": point},
            )
        return _Branching(path_to(rows, target.parent_id), target.parent_id, target.parent_id, [])
    # A regeneration: the reply's question (and any tool results) are sent again, not stored again.
    asked = target.parent_id if target.role == Role.ASSISTANT else target.id
    path = path_to(rows, asked)
    last_user = max((i for i, row in enumerate(path) if row.role == Role.USER), default=None)
    if not path or last_user is None or path[-1].role == Role.ASSISTANT:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"message {target_id!r} answers no question to answer again",
            metadata={"param": point},
        )
    return _Branching(path[:last_user], asked, asked, path[last_user:])


async def _summarised(
    summaries: Summaries,
    tenant_id: str,
    conversation_id: str,
    branch: list[MessageRow],
    cut: FittedContext,
    continues: str,
    system: Sequence[common_pb2.ChatMessage],
    fit: Callable[[Sequence[common_pb2.ChatMessage], list[common_pb2.ChatMessage]], Awaitable[FittedContext]],
    report: chat_service_pb2.ContextReport,
) -> FittedContext:
    """The history ``cut`` left out replaced by the branch's stored summary,
    when one exists; a summary covering all that is still left out is
    refreshed in the background."""
    summary = await summaries.for_branch(tenant_id, conversation_id, branch)
    covered, after, fitted = 0, 0, cut
    if summary is not None:
        covered = summary.turns
        after = next(i for i, row in enumerate(branch) if row.id == summary.through_message_id) + 1
        try:
            fitted = await fit(
                [*system, summary_message(summary)], history_messages(branch[after:], continues)
            )
        except InvalidArgument:
            # The summary itself leaves no room: the turn goes on without it.
            return cut
        report.summarised_turns = covered
    needed = covered + _dropped_turns(history_messages(branch[after:], continues), fitted)
    if needed > covered:
        summaries.refresh(tenant_id, conversation_id, branch, needed)
    return fitted


def _dropped_turns(history: list[common_pb2.ChatMessage], fitted: FittedContext) -> int:
    """How many whole turns of ``history`` the fit left out."""
    _, turns = split_turns(history)
    left, dropped = fitted.dropped_messages, 0
    for turn in turns:
        if left <= 0:
            break
        left -= len(turn)
        dropped += 1
    return dropped
