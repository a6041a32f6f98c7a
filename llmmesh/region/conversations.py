"""The conversation RPCs of the region's ChatService, on the zone store.

Every call authenticates its caller against the cached policy snapshot and
reads or writes only that caller's tenant's conversations: a conversation of
another tenant answers exactly as a missing or deleted one does (NOT_FOUND
``CONVERSATION_NOT_FOUND``), so nothing can be learnt about it. Malformed
input (an id, a page size, a page token, a title) is INVALID_ARGUMENT with
the offending field in ErrorInfo's ``param``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from datetime import datetime

from google.protobuf import timestamp_pb2

from llmmesh.core.errors import InvalidArgument, NotFound, Reason
from llmmesh.core.ids import ConversationId
from llmmesh.core.model_resolver import ModelResolver
from llmmesh.core.pricing import format_usd
from llmmesh.region.modelchoice.model_policy import require_allowed
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.region.settings import RegionSettings
from llmmesh.region.zone_store.paging import encode_position
from llmmesh.region.zone_store.rows import ConversationRow, MessageRow, Role
from llmmesh.region.zone_store.store import ZoneStore, utc_now
from llmmesh.region.zone_store.tree import BranchRow, branches, current_branch, path_to
from llmmesh.v1 import chat_service_pb2, common_pb2

AUTO_MODEL = "auto"
"""The model of a conversation created without one: each turn takes the tier's default."""

# AIP-158 page sizes, as chat_service.proto documents them.
CONVERSATIONS_PAGE = (20, 100)
MESSAGES_PAGE = (50, 500)

CHAT_ROLES = {
    Role.SYSTEM: common_pb2.CHAT_ROLE_SYSTEM,
    Role.USER: common_pb2.CHAT_ROLE_USER,
    Role.ASSISTANT: common_pb2.CHAT_ROLE_ASSISTANT,
    Role.TOOL: common_pb2.CHAT_ROLE_TOOL,
}
"""How stored roles are named on the wire."""


class ConversationService:
    """Creates, reads, lists and deletes the caller's conversations in this region's zone."""

    def __init__(
        self,
        policy: PolicyCache,
        store: ZoneStore,
        models: ModelResolver,
        settings: RegionSettings,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._policy = policy
        self._store = store
        self._models = models
        self._settings = settings
        self._clock = clock

    async def create(
        self, request: chat_service_pb2.CreateConversationRequest, secret: str | None
    ) -> chat_service_pb2.CreateConversationResponse:
        """A new, empty conversation homed in this region.

        A named model is resolved for the caller's tier (NOT_FOUND
        ``UNKNOWN_MODEL``, PERMISSION_DENIED ``MODEL_NOT_ALLOWED``) and stored
        by its canonical name; without one the conversation keeps
        :data:`AUTO_MODEL`, so it follows the tier's default.
        """
        caller = await self._policy.authenticate_fresh(secret)
        if len(request.system_prompt) > self._settings.max_message_chars:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"system_prompt is longer than {self._settings.max_message_chars} characters",
                metadata={"param": "system_prompt"},
            )
        model = request.model or AUTO_MODEL
        if model != AUTO_MODEL:
            resolved = await self._models.resolve(model, caller.tier)
            require_allowed(resolved, list(caller.tenant.allowed_models))
            model = resolved.name
        # The store refuses an over-long title (``param`` ``title``).
        row = await self._store.create_conversation(
            caller.tenant_id, model, request.title, request.system_prompt
        )
        return chat_service_pb2.CreateConversationResponse(conversation=conversation_proto(row))

    async def get(
        self, request: chat_service_pb2.GetConversationRequest, secret: str | None
    ) -> chat_service_pb2.GetConversationResponse:
        """One live conversation of the caller's tenant."""
        caller = await self._policy.authenticate_fresh(secret)
        conversation_id = self._conversation_id(request.conversation_id)
        row = await self._store.get_conversation(caller.tenant_id, conversation_id)
        return chat_service_pb2.GetConversationResponse(conversation=conversation_proto(row))

    async def list(
        self, request: chat_service_pb2.ListConversationsRequest, secret: str | None
    ) -> chat_service_pb2.ListConversationsResponse:
        """A page of the caller's live conversations, newest first."""
        caller = await self._policy.authenticate_fresh(secret)
        size = page_size(request.page_size, CONVERSATIONS_PAGE)
        token = request.page_token
        if request.after_id:
            _one_cursor(request.page_token)
            token = encode_position(await self._after(caller.tenant_id, request.after_id))
        page = await self._store.list_conversations(caller.tenant_id, size, token)
        return chat_service_pb2.ListConversationsResponse(
            conversations=[conversation_proto(row) for row in page.items],
            next_page_token=page.next_page_token,
        )

    async def delete(
        self, request: chat_service_pb2.DeleteConversationRequest, secret: str | None
    ) -> chat_service_pb2.DeleteConversationResponse:
        """Soft-delete a conversation: every later read answers NOT_FOUND.

        The returned conversation's ``delete_time`` is this region's clock at
        the deletion, to within the store's own write of it.
        """
        caller = await self._policy.authenticate_fresh(secret)
        conversation_id = self._conversation_id(request.conversation_id)
        row = await self._store.get_conversation(caller.tenant_id, conversation_id)
        await self._store.soft_delete_conversation(caller.tenant_id, conversation_id)
        deleted = conversation_proto(row)
        now = self._clock()
        deleted.update_time.CopyFrom(timestamp(now))
        deleted.delete_time.CopyFrom(timestamp(now))
        return chat_service_pb2.DeleteConversationResponse(conversation=deleted)

    async def list_messages(
        self, request: chat_service_pb2.ListMessagesRequest, secret: str | None
    ) -> chat_service_pb2.ListMessagesResponse:
        """A page of one branch of a conversation's messages, oldest first:
        the branch ending at ``leaf_id``, or the current one; or, with
        ``request_id``, the messages that request stored."""
        caller = await self._policy.authenticate_fresh(secret)
        conversation_id = self._conversation_id(request.conversation_id)
        size = page_size(request.page_size, MESSAGES_PAGE)
        after = decode_message_position(request.page_token, conversation_id) if request.page_token else 0
        stored = await self._store.messages(caller.tenant_id, conversation_id)
        branch = _listed(stored, request, conversation_id)
        if request.after_id:
            _one_cursor(request.page_token)
            after = _message_seq(branch, conversation_id, request.after_id)
        rows = [row for row in branch if row.seq > after][: size + 1]
        page = rows[:size]
        token = encode_message_position(conversation_id, page[-1].seq) if len(rows) > size else ""
        return chat_service_pb2.ListMessagesResponse(
            messages=[message_proto(row) for row in page], next_page_token=token
        )

    async def _after(self, tenant_id: str, after_id: str) -> ConversationRow:
        """The live conversation a page named by id starts after; INVALID_ARGUMENT (``after_id``)
        when there is none (a deleted one included: its place in the order is gone)."""
        try:
            return await self._store.get_conversation(tenant_id, after_id)
        except NotFound as err:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"after_id {after_id!r} names no conversation of yours",
                metadata={"param": "after_id"},
            ) from err

    async def list_branches(
        self, request: chat_service_pb2.ListBranchesRequest, secret: str | None
    ) -> chat_service_pb2.ListBranchesResponse:
        """A page of a conversation's branches, the newest leaf first."""
        caller = await self._policy.authenticate_fresh(secret)
        conversation_id = self._conversation_id(request.conversation_id)
        size = page_size(request.page_size, CONVERSATIONS_PAGE)
        stored = await self._store.messages(caller.tenant_id, conversation_id)
        found = branches(stored)
        seqs = {row.id: row.seq for row in stored}
        start = 0
        # Branches are listed by their leaves' seq, newest first: a page starts after the last one served.
        last = None
        if request.page_token:
            last = decode_message_position(request.page_token, conversation_id)
        if request.after_id:
            _one_cursor(request.page_token)
            last = _branch_seq(found, seqs, conversation_id, request.after_id)
        if last is not None:
            start = next((i for i, b in enumerate(found) if seqs[b.leaf_id] < last), len(found))
        page = found[start : start + size]
        token = ""
        if start + size < len(found):
            token = encode_message_position(
                conversation_id, next(r.seq for r in stored if r.id == page[-1].leaf_id)
            )
        return chat_service_pb2.ListBranchesResponse(
            branches=[branch_proto(b) for b in page], next_page_token=token
        )

    def _conversation_id(self, text: str) -> str:
        """``text`` when it is a conversation id of this zone; INVALID_ARGUMENT otherwise.

        A well-formed id of another zone says so (``WRONG_ZONE``): the id
        itself names its zone, so this tells the caller nothing it did not send.
        """
        if not text:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "conversation_id is required", metadata={"param": "conversation_id"}
            )
        parsed = ConversationId.parse(text)
        if parsed is None:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "conversation_id is not a conversation id",
                metadata={"param": "conversation_id"},
            )
        if parsed.zone != self._settings.zone:
            raise InvalidArgument(
                Reason.WRONG_ZONE,
                f"conversation {text!r} lives in zone {parsed.zone!r}; "
                f"region {self._settings.region} serves zone {self._settings.zone!r}",
                metadata={"param": "conversation_id", "zone": parsed.zone},
            )
        return text


def _listed(
    stored: list[MessageRow], request: chat_service_pb2.ListMessagesRequest, conversation_id: str
) -> list[MessageRow]:
    """The messages a listing covers, in order: one request's, or one branch's."""
    if request.request_id:
        if request.leaf_id:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "give leaf_id or request_id, not both",
                metadata={"param": "leaf_id"},
            )
        return [row for row in stored if row.request_id == request.request_id]
    if not request.leaf_id:
        return current_branch(stored)
    try:
        return path_to(stored, request.leaf_id)
    except KeyError:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"leaf_id {request.leaf_id!r} is not a message of conversation {conversation_id!r}",
            metadata={"param": "leaf_id"},
        ) from None


def _message_seq(branch: list[MessageRow], conversation_id: str, after_id: str) -> int:
    """The position of message ``after_id`` in the listed branch; INVALID_ARGUMENT (``after_id``)
    when it is not one of its messages."""
    seq = next((row.seq for row in branch if row.id == after_id), None)
    if seq is None:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"after_id {after_id!r} is not a message of conversation {conversation_id!r} listed here",
            metadata={"param": "after_id"},
        )
    return seq


def _branch_seq(found: list[BranchRow], seqs: dict[str, int], conversation_id: str, after_id: str) -> int:
    """The position of the branch whose leaf is ``after_id``; INVALID_ARGUMENT
    (``after_id``) when no branch of the conversation ends there."""
    if not any(branch.leaf_id == after_id for branch in found):
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"after_id {after_id!r} is not the leaf of a branch of conversation {conversation_id!r}",
            metadata={"param": "after_id"},
        )
    return seqs[after_id]


def _one_cursor(page_token: str) -> None:
    if page_token:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "give page_token or after_id, not both", metadata={"param": "after_id"}
        )


def page_size(requested: int, bounds: tuple[int, int]) -> int:
    """AIP-158: 0 means the default, more than the maximum is clamped, negative is INVALID_ARGUMENT."""
    default, most = bounds
    if requested < 0:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "page_size must not be negative", metadata={"param": "page_size"}
        )
    return min(requested or default, most)


def encode_message_position(conversation_id: str, seq: int) -> str:
    """The token of the page of ``conversation_id``'s messages after the one numbered ``seq``."""
    return base64.urlsafe_b64encode(f"{conversation_id}|{seq}".encode()).decode("ascii")


def decode_message_position(token: str, conversation_id: str) -> int:
    """The ``seq`` a token's page starts after; INVALID_ARGUMENT when malformed or another conversation's."""
    try:
        owner, _, seq_text = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8").partition("|")
        seq = int(seq_text)
    except (binascii.Error, UnicodeError, ValueError):
        seq = -1
    if seq < 0 or owner != conversation_id:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "malformed page_token", metadata={"param": "page_token"}
        )
    return seq


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def conversation_proto(row: ConversationRow) -> chat_service_pb2.Conversation:
    return chat_service_pb2.Conversation(
        id=row.id,
        tenant_id=row.tenant_id,
        title=row.title,
        model=row.model,
        system_prompt=row.system_prompt,
        zone=row.zone,
        home_region=row.home_region,
        create_time=timestamp(row.created_at),
        update_time=timestamp(row.updated_at),
    )


def message_proto(row: MessageRow) -> chat_service_pb2.StoredMessage:
    try:
        finish = common_pb2.FinishReason.Value(row.finish_reason)
    except ValueError:  # not an assistant message, or a reason this build does not know
        finish = common_pb2.FINISH_REASON_UNSPECIFIED
    return chat_service_pb2.StoredMessage(
        id=row.id,
        conversation_id=row.conversation_id,
        role=CHAT_ROLES.get(row.role, common_pb2.CHAT_ROLE_UNSPECIFIED),
        content=row.content,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cost_usd=format_usd(row.cost_usd),
        model=row.model,
        request_id=row.request_id or "",
        finish_reason=finish,
        create_time=timestamp(row.created_at),
        tool_calls=[common_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in row.tool_calls],
        tool_call_id=row.tool_call_id,
        parent_id=row.parent_id,
    )


def branch_proto(branch: BranchRow) -> chat_service_pb2.Branch:
    return chat_service_pb2.Branch(
        leaf_id=branch.leaf_id,
        message_count=branch.message_count,
        fork_id=branch.fork_id,
        update_time=timestamp(branch.updated_at),
        current=branch.current,
    )
