"""The engine's view of a turn: its messages (a conversation's history
fitted into the model's window after its system messages and lead), the
prompt tokens as the model's pods count them, and how much it may produce."""

from __future__ import annotations

from collections.abc import Sequence

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.ids import new_id
from llmmesh.region.engine_pool import EnginePool
from llmmesh.region.lifecycle.summaries import Summaries
from llmmesh.region.policy_cache import Caller
from llmmesh.region.settings import RegionSettings
from llmmesh.region.tokenizer_client import TokenizerClient
from llmmesh.region.turn.conversation_context import (
    ConversationContext,
    check_branch_point,
    conversation_context,
)
from llmmesh.region.turn.sampling import fresh_draw
from llmmesh.region.turn.state import PreparedTurn
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import chat_service_pb2, common_pb2, model_registry_service_pb2


class TurnPrompts:
    """Turns a start message into a :class:`PreparedTurn` on one model.

    ``summaries`` keeps long conversations' summaries (None: history that
    does not fit is cut, not summarised)."""

    def __init__(
        self,
        settings: RegionSettings,
        pool: EnginePool,
        tokenizer: TokenizerClient,
        store: ZoneStore,
        summaries: Summaries | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._tokenizer = tokenizer
        self._store = store
        self._summaries = summaries

    async def prepare(
        self,
        caller: Caller,
        model: model_registry_service_pb2.Model,
        start: chat_service_pb2.ChatStart,
        lead: Sequence[common_pb2.ChatMessage] = (),
    ) -> PreparedTurn:
        """The engine's view of the turn: a conversation's history fitted into
        the window after its system messages and ``lead``, the prompt tokens
        as the engine counts them. ``start`` is the turn's own copy: a
        regeneration's fresh draw is set on it."""
        request_id = start.request_id or new_id("req")
        fresh_draw(start, request_id)
        window = self._pool.context_window(model.name)
        sampling = start.sampling
        # Tool definitions are prompt text: rendered into it, counted with it.
        tools = tuple(sampling.tools)
        requested = sampling.max_tokens if sampling.HasField("max_tokens") else None
        messages: Sequence[common_pb2.ChatMessage] = start.messages
        context: ConversationContext | None = None
        continues = start.continuation.original_request_id if start.HasField("continuation") else ""
        check_branch_point(start)
        if start.conversation_id:

            async def count(candidate: Sequence[common_pb2.ChatMessage]) -> int:
                return len(await self._tokenizer.tokenize(model.name, candidate, tools=tools))

            context = await conversation_context(
                self._store,
                caller.tenant_id,
                start,
                continues=continues,
                window_tokens=window,
                # Without max_tokens, history leaves a reply room to be useful.
                reserve_output_tokens=requested or min(self._settings.default_output_tokens, window // 4),
                count_tokens=count,
                summaries=self._summaries,
                lead=lead,
            )
            messages = context.messages
        token_ids = await self._tokenizer.tokenize(model.name, messages, tools=tools)
        if window and len(token_ids) + (requested or 1) > window:
            raise InvalidArgument(
                Reason.PROMPT_TOO_LONG,
                f"the prompt has {len(token_ids)} tokens and max_tokens asks for {requested or 1} more; "
                f"model {model.name} has a context window of {window} tokens",
                metadata={"param": "messages"},
            )
        room = window - len(token_ids) if window else requested or self._settings.default_output_tokens
        max_output = requested or min(self._settings.default_output_tokens, room)
        return PreparedTurn(
            request_id,
            model,
            tuple(messages),
            token_ids,
            max_output,
            context.conversation_id if context else None,
            context.user_text if context else None,
            continues or None,
            context.tool_results if context else (),
            start.user,
            context,
        )
