"""The zone store: conversations, their messages and the durable usage outbox of one zone.

Conversation content lives here and nowhere else (the global plane keeps
only counts and costs). Every read and write names the tenant: a
conversation of another tenant, like a missing or deleted one, is
``NOT_FOUND`` (``CONVERSATION_NOT_FOUND``), so one tenant can never learn
that another's conversation exists.

A turn is recorded in one transaction (:meth:`ZoneStore.record_turn`): the
user message, the assistant message and the usage row either all land or
none does. The usage row's primary key, the tenant and request id, is
claimed first, so a repeated turn (a retry, a replayed stream) changes
nothing; concurrent turns on one conversation take its row lock and get
consecutive ``seq``.

A turn continued in another region of the zone after its region failed
mid-stream is recorded by :meth:`ZoneStore.record_continuation`, billed once
whichever region writes first.

Before any engine work, a region records that it accepted a turn
(:meth:`ZoneStore.accept_turn`, :mod:`region.zone_store.turn_starts`): a
tenant's request id is taken once in the zone, and a continuation is
accepted only for a turn the zone started for the same tenant.

Request ids are a namespace per tenant throughout: every row keyed by one
(markers, usage rows, messages) is keyed by tenant and request id, and
every lookup names the tenant, so one tenant's ids never collide with,
block or reveal another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from llmmesh.core.errors import InvalidArgument, NotFound, Reason
from llmmesh.core.ids import ConversationId
from llmmesh.core.sqlstore import SqlStore, create_store_engine, insert_new_rows
from llmmesh.region.zone_store import schema
from llmmesh.region.zone_store.migrations import MIGRATIONS
from llmmesh.region.zone_store.paging import decode_position, encode_position
from llmmesh.region.zone_store.purge import DeletedConversation, deleted_page, purge, purge_tenant
from llmmesh.region.zone_store.queries import (
    append_message,
    conversation_of,
    message_of,
    message_of_request,
    messages_of_request,
    store_turn_messages,
    touch,
    turn_tokens,
)
from llmmesh.region.zone_store.rows import (
    AcceptedTurn,
    AssistantMessage,
    ContinuedTurn,
    ConversationPage,
    ConversationRow,
    MessageRow,
    PendingUsage,
    Role,
    SummaryRow,
    ToolResult,
    TurnRecord,
    TurnStart,
    UsageKey,
)
from llmmesh.region.zone_store.settlement import Settlement, UsageCodec, settle_turn
from llmmesh.region.zone_store.summaries import latest_summary, save_summary
from llmmesh.region.zone_store.turn_starts import accept_turn, duplicate_request, mark_started

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
UsageEncoder = Callable[[str, int, int, str], bytes]
"""Serializes the ``UsageRecord`` of (request id, input tokens, output tokens, the
request id of the failed-over turn it continues or "") for the outbox."""

_C = schema.conversations
_M = schema.messages
_O = schema.usage_outbox
_DEFAULT_PAGE = 50
_MAX_PAGE = 500
_ID_CHUNK = 500  # request ids per UPDATE … IN (…)
_MAX_TITLE = 256
_MAX_REQUEST_ID = 128
# Grouped writes' urgency: a turn's acceptance holds up its engine work, so it
# goes ahead of the start marks, which run while the pod works on the first token.
ACCEPTANCE = 2
START_MARK = 1


def utc_now() -> datetime:
    return datetime.now(UTC)


class ZoneStore(SqlStore):
    """The residency-bound store of zone ``zone``, as region ``region`` uses it.

    New conversations are homed in ``region``; the usage rows this region
    records are the ones :meth:`pending_usage` hands to its shipper.
    """

    store_label = "zone"

    def __init__(self, engine: Engine, zone: str, region: str, *, clock: Clock = utc_now) -> None:
        if ConversationId.parse(str(ConversationId(zone, region, "0" * 16))) is None:
            raise ValueError(f"zone {zone!r} and region {region!r} cannot name a conversation")
        super().__init__(engine)
        self.zone = zone
        self.region = region
        self._clock = clock

    @classmethod
    async def open(cls, url: str, zone: str, region: str, *, clock: Clock = utc_now) -> ZoneStore:
        """Connect to ``url`` and bring it to this release's schema (see :meth:`create_schema`)."""
        store = cls(create_store_engine(url), zone, region, clock=clock)
        await asyncio.to_thread(store.create_schema)
        return store

    def create_schema(self) -> None:
        """Bring the database to this release's schema (:mod:`llmmesh.region.zone_store.migrations`)."""
        self.migrate(MIGRATIONS)

    # ------------------------------------------------------------ conversations

    async def create_conversation(
        self, tenant_id: str, model: str, title: str = "", system_prompt: str = ""
    ) -> ConversationRow:
        """A new, empty conversation of ``tenant_id`` homed in this region."""
        _require_tenant(tenant_id)
        if len(title) > _MAX_TITLE:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, f"title is longer than {_MAX_TITLE}", metadata={"param": "title"}
            )
        now = self._clock()
        row = ConversationRow(
            str(ConversationId.new(self.zone, self.region)),
            tenant_id,
            self.zone,
            self.region,
            model,
            title,
            now,
            now,
            system_prompt,
        )
        await self.transaction(lambda conn: conn.execute(sa.insert(_C).values(**asdict(row))))
        return row

    async def get_conversation(self, tenant_id: str, conversation_id: str) -> ConversationRow:
        """The tenant's live conversation; NOT_FOUND when missing, deleted or another tenant's."""
        return await self.transaction(lambda conn: self._live(conn, tenant_id, conversation_id))

    async def list_conversations(
        self, tenant_id: str, page_size: int = 0, page_token: str = ""
    ) -> ConversationPage:
        """The tenant's live conversations, newest first (AIP-158).

        ``page_size`` 0 means 50, more than 500 is clamped, negative is
        INVALID_ARGUMENT, as is a malformed token. Tokens are keyset
        positions: conversations created between calls are never served twice.
        """
        if page_size < 0:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "page_size must be >= 0", metadata={"param": "page_size"}
            )
        size = min(page_size or _DEFAULT_PAGE, _MAX_PAGE)
        after = decode_position(page_token) if page_token else None

        def read(conn: Connection) -> list[ConversationRow]:
            query = sa.select(_C).where(
                _C.c.tenant_id == tenant_id, _C.c.zone == self.zone, _C.c.deleted_at.is_(None)
            )
            if after is not None:
                created, last_id = after
                query = query.where(
                    sa.or_(_C.c.created_at < created, sa.and_(_C.c.created_at == created, _C.c.id < last_id))
                )
            query = query.order_by(_C.c.created_at.desc(), _C.c.id.desc()).limit(size + 1)
            return [conversation_of(row) for row in conn.execute(query)]

        rows = await self.transaction(read)
        page = rows[:size]
        token = encode_position(page[-1]) if len(rows) > size else ""
        return ConversationPage(page, token)

    async def soft_delete_conversation(self, tenant_id: str, conversation_id: str) -> None:
        """Hide the conversation from every read; NOT_FOUND as for :meth:`get_conversation`."""
        now = self._clock()

        def delete(conn: Connection) -> None:
            done = conn.execute(
                sa.update(_C)
                .where(*self._visible(tenant_id, conversation_id))
                .values(deleted_at=now, updated_at=now)
            )
            if done.rowcount != 1:
                raise _not_found(conversation_id)

        await self.transaction(delete)

    # ------------------------------------------------------------ messages

    async def messages(self, tenant_id: str, conversation_id: str) -> list[MessageRow]:
        """The conversation's messages in ``seq`` order; NOT_FOUND as for :meth:`get_conversation`."""

        def read(conn: Connection) -> list[MessageRow]:
            self._live(conn, tenant_id, conversation_id)
            query = sa.select(_M).where(_M.c.conversation_id == conversation_id).order_by(_M.c.seq)
            return [message_of(row) for row in conn.execute(query)]

        return await self.transaction(read)

    async def message_page(
        self, tenant_id: str, conversation_id: str, *, after_seq: int = 0, limit: int = _DEFAULT_PAGE
    ) -> list[MessageRow]:
        """Up to ``limit`` of the conversation's messages with ``seq`` above
        ``after_seq``, in ``seq`` order; NOT_FOUND as for :meth:`get_conversation`."""

        def read(conn: Connection) -> list[MessageRow]:
            self._live(conn, tenant_id, conversation_id)
            query = (
                sa.select(_M)
                .where(_M.c.conversation_id == conversation_id, _M.c.seq > after_seq)
                .order_by(_M.c.seq)
                .limit(limit)
            )
            return [message_of(row) for row in conn.execute(query)]

        return await self.transaction(read)

    async def append_user_message(
        self,
        tenant_id: str,
        conversation_id: str,
        content: str,
        request_id: str | None = None,
        parent_id: str | None = None,
    ) -> MessageRow:
        """Add a user message after ``parent_id`` (None: the newest message).

        With a ``request_id`` it is idempotent: the message that request
        already added is returned instead of a second one.
        """
        now = self._clock()

        def append(conn: Connection) -> MessageRow:
            conversation = self._live(conn, tenant_id, conversation_id, lock=True)
            if request_id is not None:
                existing = message_of_request(conn, tenant_id, request_id, Role.USER)
                if existing is not None:
                    if existing.conversation_id != conversation.id:
                        raise duplicate_request(request_id)
                    return existing
            message = append_message(
                conn, conversation, Role.USER, content, request_id, now, parent_id=parent_id
            )
            touch(conn, conversation.id, now)
            return message

        return await self.transaction(append)

    # ------------------------------------------------------------ turns

    async def accept_turn(self, start: TurnStart) -> AcceptedTurn:
        """Record that this region accepted ``start``'s turn, before any
        engine work. ALREADY_EXISTS (``DUPLICATE_REQUEST``) for a request id
        the tenant used before, unless its turn has streamed nothing yet
        (then this acceptance takes it over); another tenant's use of the
        same id is no concern of this one. For a continuation
        the zone cannot vouch for, NOT_FOUND (``REQUEST_NOT_FOUND``),
        INVALID_ARGUMENT, FAILED_PRECONDITION, or ALREADY_EXISTS when the turn
        was continued before. Written with the other grouped work."""
        _require_tenant(start.tenant_id)
        _require_request_id(start.request_id)
        now = self._clock()
        return await self.grouped(lambda conn: accept_turn(conn, start, self.region, now), urgency=ACCEPTANCE)

    async def mark_started(self, tenant_id: str, request_id: str, holder: str) -> bool:
        """Note that the tenant's turn accepted as ``holder`` is about to stream;
        False when another acceptance took its request id over (it must stop)."""
        return await self.grouped(
            lambda conn: mark_started(conn, tenant_id, request_id, holder), urgency=START_MARK
        )

    async def record_turn(
        self,
        tenant_id: str,
        conversation_id: str | None,
        request_id: str,
        user_message: str | None,
        assistant: AssistantMessage,
        usage: bytes,
        tokens: int = 0,
        tool_results: Sequence[ToolResult] = (),
        parent_id: str | None = None,
    ) -> TurnRecord:
        """Record a finished turn in one transaction: its messages and its usage row.

        ``usage`` is the serialized ``UsageRecord`` the shipper sends to
        billing and ``tokens`` its input plus output tokens (for
        :meth:`tenant_tokens`). A request id the tenant recorded before makes
        this a no-op (``duplicate``); another tenant's is another turn.
        Without a conversation, or when the
        conversation is no longer the tenant's live one (deleted while the
        turn ran), only the usage row is written: the tokens were spent,
        and content never lands where the tenant cannot see it. A
        ``user_message`` already added by :meth:`append_user_message` under
        the same request id is not added again. The turn's ``tool_results``
        (tool messages answering the calls of an earlier reply) are stored
        before its user message, one message each. The turn's first new
        message follows ``parent_id`` in the conversation's tree (None: the
        newest message), each other the one before it.
        """
        _require_tenant(tenant_id)
        _require_request_id(request_id)
        now = self._clock()
        usage_row = {
            "request_id": request_id,
            "tenant_id": tenant_id,
            "home_region": self.region,
            "usage": usage,
            "tokens": tokens,
            "created_at": now,
            "attempts": 0,
            "shipped_at": None,
        }

        def record(conn: Connection) -> TurnRecord:
            if not insert_new_rows(conn, _O, [usage_row]):
                return TurnRecord(request_id, True, messages_of_request(conn, tenant_id, request_id))
            if conversation_id is None:
                return TurnRecord(request_id, False, ())
            conversation = self._find_live(conn, tenant_id, conversation_id, lock=True)
            if conversation is None:
                log.warning("turn %s: conversation gone; only its usage is recorded", request_id)
                return TurnRecord(request_id, False, ())
            stored = store_turn_messages(
                conn, conversation, request_id, user_message, assistant, tool_results, parent_id, now
            )
            return TurnRecord(request_id, False, tuple(stored))

        return await self.grouped(record)

    async def record_continuation(
        self,
        tenant_id: str,
        conversation_id: str | None,
        request_id: str,
        user_message: str | None,
        continued: ContinuedTurn,
        reply: AssistantMessage,
        output_tokens: int,
        encode_usage: UsageEncoder,
        tool_results: Sequence[ToolResult] = (),
        parent_id: str | None = None,
    ) -> TurnRecord:
        """Record a continuation (request ``request_id``, which generated
        ``output_tokens``) of turn ``continued.request_id`` in one transaction.

        Billing: the turn as a whole is billed its input once and the output
        its client received, whichever region records first. When the
        original request id has no usage row (its region died first), one is
        written for it here with the whole turn, its input and all the
        output, so the turn counts as one request; this request's row has
        nothing of its own and is never shipped. When the original region
        recorded (it survived a partition), this request's row has what the
        turn's rows (the original's and the continuations the zone accepted
        for it) do not cover yet, so nothing is billed twice; the original
        region's write coming later is a no-op, its request id being taken.
        ``encode_usage`` makes each usage row.

        Content, for a conversation: the turn's tool messages and user message
        once, and one assistant message under the original request id holding ``reply``,
        the whole reply (the original region's partial message, if it wrote
        one, is completed in place). A request id recorded before makes this
        a no-op (``duplicate``). Every request id here is the tenant's. New
        messages hang in the tree as :meth:`record_turn` hangs them.
        """
        _require_tenant(tenant_id)
        _require_request_id(request_id)
        _require_request_id(continued.request_id)
        original = continued.request_id
        now = self._clock()

        def row(rid: str, input_tokens: int, output: int, continues: str = "") -> dict[str, Any]:
            return {
                "request_id": rid,
                "tenant_id": tenant_id,
                "home_region": self.region,
                "usage": encode_usage(rid, input_tokens, output, continues),
                "tokens": input_tokens + output,
                "created_at": now,
                "attempts": 0,
                "shipped_at": None,
            }

        def record(conn: Connection) -> TurnRecord:
            if conn.execute(sa.select(_O.c.request_id).where(*_usage_of(tenant_id, request_id))).first():
                return TurnRecord(request_id, True, messages_of_request(conn, tenant_id, original))
            delivered = continued.output_tokens + output_tokens
            if insert_new_rows(conn, _O, [row(original, continued.input_tokens, delivered)]):
                # Nothing was recorded for the turn: its original request id
                # bills all of it, one request; this attempt's row only keeps
                # it from being recorded twice, and has nothing to ship.
                mine = row(request_id, 0, 0) | {"shipped_at": now}
            else:
                # What the turn's rows so far leave of the output delivered until now.
                whole = continued.input_tokens + delivered
                share = max(0, whole - turn_tokens(conn, tenant_id, original, request_id))
                # Billed as tokens of the original's request, not a request of its own.
                mine = row(request_id, 0, share, original)
            if not insert_new_rows(conn, _O, [mine]):
                raise duplicate_request(request_id)
            if conversation_id is None:
                return TurnRecord(request_id, False, ())
            conversation = self._find_live(conn, tenant_id, conversation_id, lock=True)
            if conversation is None:
                log.warning("turn %s: conversation gone; only its usage is recorded", request_id)
                return TurnRecord(request_id, False, ())
            stored = store_turn_messages(
                conn, conversation, original, user_message, reply, tool_results, parent_id, now
            )
            return TurnRecord(request_id, False, tuple(stored))

        return await self.grouped(record)

    async def settle_turn(
        self, tenant_id: str, request_id: str, delivered_output_tokens: int, codec: UsageCodec
    ) -> Settlement:
        """Bill the tenant's turn ``request_id``, failed by the mesh, the
        ``delivered_output_tokens`` its client received, across its rows in
        the zone (:mod:`region.zone_store.settlement`). NOT_FOUND
        (``REQUEST_NOT_FOUND``) for a turn the zone never accepted for the
        tenant; INVALID_ARGUMENT for a continuation's request id."""
        _require_tenant(tenant_id)
        _require_request_id(request_id)
        now = self._clock()
        return await self.grouped(
            lambda conn: settle_turn(
                conn, tenant_id, request_id, delivered_output_tokens, self.region, now, codec
            )
        )

    # ------------------------------------------------------------ usage outbox

    async def pending_usage(self, limit: int = 100) -> list[PendingUsage]:
        """Up to ``limit`` unshipped usage rows this region recorded, each
        with its key (tenant and request id) and serialized record.

        Rows that failed fewer times come first, so a record billing keeps
        rejecting does not hold back the others.
        """
        query = (
            sa.select(_O.c.tenant_id, _O.c.request_id, _O.c.usage)
            .where(_O.c.shipped_at.is_(None), _O.c.home_region == self.region)
            .order_by(_O.c.attempts, _O.c.created_at, _O.c.tenant_id, _O.c.request_id)
            .limit(limit)
        )
        rows = await self.transaction(lambda conn: conn.execute(query).all())
        return [PendingUsage(row.tenant_id, row.request_id, bytes(row.usage)) for row in rows]

    async def tenant_tokens(
        self,
        tenant_id: str,
        since: datetime,
        *,
        shipped_after: datetime | None = None,
        request_id_prefix: str = "",
    ) -> int:
        """Tokens of the tenant's turns recorded in this zone since ``since``,
        by any region of the zone. With ``shipped_after``, only rows not
        shipped to billing by then (billing's own total counts the rest);
        with ``request_id_prefix``, only rows whose request ids begin with it."""
        conditions = [_O.c.tenant_id == tenant_id, _O.c.created_at >= since]
        if request_id_prefix:
            conditions.append(_O.c.request_id.startswith(request_id_prefix, autoescape=True))
        if shipped_after is not None:
            conditions.append(sa.or_(_O.c.shipped_at.is_(None), _O.c.shipped_at > shipped_after))
        query = sa.select(sa.func.coalesce(sa.func.sum(_O.c.tokens), 0)).where(*conditions)
        return int(await self.transaction(lambda conn: conn.execute(query).scalar_one()))

    async def pending_usage_count(self) -> int:
        """How many usage rows this region recorded are not shipped yet."""
        query = (
            sa.select(sa.func.count())
            .select_from(_O)
            .where(_O.c.shipped_at.is_(None), _O.c.home_region == self.region)
        )
        return int(await self.transaction(lambda conn: conn.execute(query).scalar_one()))

    async def mark_shipped(self, keys: Sequence[UsageKey]) -> int:
        """Mark the rows of ``keys`` (tenant, request id) delivered to billing
        (call only after it accepted them); how many changed."""
        now = self._clock()
        return await self._update_pending(keys, {"shipped_at": now})

    async def note_attempt(self, keys: Sequence[UsageKey]) -> None:
        """Count a failed delivery of the unshipped rows among ``keys``."""
        await self._update_pending(keys, {"attempts": _O.c.attempts + 1})

    async def _update_pending(self, keys: Sequence[UsageKey], values: dict[str, Any]) -> int:
        by_tenant: dict[str, list[str]] = {}
        # Sorted: one lock order for every caller.
        for tenant_id, request_id in sorted(set(keys)):
            by_tenant.setdefault(tenant_id, []).append(request_id)

        def update(conn: Connection) -> int:
            changed = 0
            for tenant_id, ids in by_tenant.items():
                for start in range(0, len(ids), _ID_CHUNK):
                    chunk = ids[start : start + _ID_CHUNK]
                    pending = sa.and_(
                        _O.c.tenant_id == tenant_id, _O.c.request_id.in_(chunk), _O.c.shipped_at.is_(None)
                    )
                    result = conn.execute(sa.update(_O).where(pending).values(values))
                    changed += result.rowcount
            return changed

        return await self.transaction(update) if by_tenant else 0

    # ------------------------------------------------------------ summaries

    async def branch_summary(
        self, tenant_id: str, conversation_id: str, path_ids: Sequence[str]
    ) -> SummaryRow | None:
        """The stored summary covering the most of a branch, given its message
        ids in order; NOT_FOUND as for :meth:`get_conversation`."""

        def read(conn: Connection) -> SummaryRow | None:
            self._live(conn, tenant_id, conversation_id)
            return latest_summary(conn, conversation_id, path_ids)

        return await self.transaction(read)

    async def save_summary(self, tenant_id: str, summary: SummaryRow) -> bool:
        """Store a branch summary of the tenant's live conversation; False when
        the conversation is gone or a summary through the same message exists."""

        def save(conn: Connection) -> bool:
            conversation = self._find_live(conn, tenant_id, summary.conversation_id)
            return conversation is not None and save_summary(conn, conversation, summary)

        return await self.transaction(save)

    # ------------------------------------------------------------ purge

    async def deleted_conversations(
        self, before: datetime, after: tuple[datetime, str] | None = None, limit: int = 100
    ) -> list[DeletedConversation]:
        """Conversations this region homes, soft-deleted before ``before``,
        oldest deletion first, after keyset position ``after`` (deleted_at, id)."""
        return await self.transaction(lambda conn: deleted_page(conn, self.region, before, after, limit))

    async def purge_conversation(self, conversation_id: str, deleted_before: datetime) -> bool:
        """Remove a conversation soft-deleted before ``deleted_before`` with its
        messages and summaries (usage rows stay); False when there is none such."""
        return await self.transaction(lambda conn: purge(conn, conversation_id, deleted_before))

    async def purge_tenant(self, tenant_id: str) -> int:
        """Remove the conversations of a deleted tenant, every one of them,
        with their messages and summaries (usage rows and turn markers stay);
        how many rows went."""
        return await self.transaction(lambda conn: purge_tenant(conn, tenant_id))

    # ------------------------------------------------------------ helpers

    def _visible(self, tenant_id: str, conversation_id: str) -> tuple[sa.ColumnElement[bool], ...]:
        return (
            _C.c.id == conversation_id,
            _C.c.tenant_id == tenant_id,
            _C.c.zone == self.zone,
            _C.c.deleted_at.is_(None),
        )

    def _find_live(
        self, conn: Connection, tenant_id: str, conversation_id: str, *, lock: bool = False
    ) -> ConversationRow | None:
        query = sa.select(_C).where(*self._visible(tenant_id, conversation_id))
        # The row lock serializes appends to one conversation, so each gets the next seq.
        row = conn.execute(query.with_for_update() if lock else query).first()
        return None if row is None else conversation_of(row)

    def _live(
        self, conn: Connection, tenant_id: str, conversation_id: str, *, lock: bool = False
    ) -> ConversationRow:
        found = self._find_live(conn, tenant_id, conversation_id, lock=lock)
        if found is None:
            raise _not_found(conversation_id)
        return found


def _usage_of(tenant_id: str, request_id: str) -> tuple[sa.ColumnElement[bool], ...]:
    return (_O.c.tenant_id == tenant_id, _O.c.request_id == request_id)


def _require_request_id(request_id: str) -> None:
    if not request_id or len(request_id) > _MAX_REQUEST_ID:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"request_id must have 1 to {_MAX_REQUEST_ID} characters",
            metadata={"param": "request_id"},
        )


def _require_tenant(tenant_id: str) -> None:
    if not tenant_id:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "tenant_id is required", metadata={"param": "tenant_id"}
        )


def _not_found(conversation_id: str) -> NotFound:
    # The same answer for missing, deleted and another tenant's: nothing to learn from it.
    return NotFound(
        Reason.CONVERSATION_NOT_FOUND,
        f"conversation {conversation_id!r} not found",
        metadata={"conversation_id": conversation_id},
    )
