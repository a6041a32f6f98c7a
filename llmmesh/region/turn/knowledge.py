"""What a region knows, put into a chat turn: excerpts of the vector stores
the turn names (:mod:`region.knowledge.retrieval_context`) and the end
user's facts (:mod:`region.knowledge.memory`), recalled before the turn and
learned after it."""

from __future__ import annotations

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.region.knowledge.memory import UserMemory
from llmmesh.region.knowledge.retrieval_context import ChatRetrievalContext, ExcerptScreen
from llmmesh.region.policy_cache import Caller
from llmmesh.region.turn.conversation_context import turn_question
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import chat_service_pb2, common_pb2, retrieval_service_pb2


class TurnKnowledge:
    """Puts retrieval excerpts and remembered facts into turns.

    ``retrieval`` is None in a region that serves no retrieval (a turn that
    asks for it is refused); ``memory`` None in one that keeps no facts."""

    def __init__(
        self,
        store: ZoneStore,
        retrieval: ChatRetrievalContext | None = None,
        memory: UserMemory | None = None,
    ) -> None:
        self._store = store
        self._retrieval = retrieval
        self.memory = memory

    async def gather(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        secret: str | None,
        screen: ExcerptScreen | None = None,
    ) -> tuple[tuple[common_pb2.ChatMessage, ...], retrieval_service_pb2.ChatRetrievalReport | None]:
        """The turn's excerpts and facts, and what retrieval found. A
        conversation turn's come back as its lead (ahead of its fitted
        history); any other turn's go into ``start``'s messages (the turn's
        own copy), and its lead is empty. ``screen`` leaves excerpts the
        content filter flags out of the prompt."""
        lead: list[common_pb2.ChatMessage] | None = [] if start.conversation_id else None
        report = await self._retrieve(start, caller, secret, lead, screen)
        if self.memory is not None:
            await self.memory.recall_into(start, caller, lead)
        return tuple(lead or ()), report

    def learn_soon(self, start: chat_service_pb2.ChatStart, caller: Caller, request_id: str) -> None:
        """Learn the end user's facts from the turn, in the background."""
        if self.memory is not None:
            self.memory.learn_soon(start, caller, request_id)

    async def drain(self) -> None:
        """Wait for the facts being written."""
        if self.memory is not None:
            await self.memory.drain()

    async def _retrieve(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        secret: str | None,
        lead: list[common_pb2.ChatMessage] | None,
        screen: ExcerptScreen | None,
    ) -> retrieval_service_pb2.ChatRetrievalReport | None:
        if self._retrieval is not None:
            question = None
            if lead is not None and start.HasField("retrieval"):
                question = await turn_question(self._store, caller.tenant_id, start)
            return await self._retrieval.augment(start, caller, secret, question, lead, screen)
        if start.HasField("retrieval"):
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "this region serves no retrieval",
                metadata={"param": "llmmesh_retrieval"},
            )
        return None
