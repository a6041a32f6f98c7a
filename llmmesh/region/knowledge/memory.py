"""Memory of a tenant's end users: facts learned from their turns and put in
the context of their later ones, when the tenant's policy enables memory
(``Tenant.memory_enabled``, off unless set) and the turn names its end user
(OpenAI's ``user``).

What learns the facts, after the turn and off its path, in the region (so
in the tenant's zone), as the region's ``memory_extractor`` setting says
(:mod:`region.knowledge.memory_model`): by default a rule extractor that reads the
turn's user messages for first-person statements ("my name is …", "I live
in …", "I work as …", "I like …", "I'm allergic to …", "call me …",
"remember that …") and keeps each as one sentence about the user; or the
zone's smallest chat model, asked for them as guided JSON.

Facts go into a turn as one system message after its own system messages
(a conversation turn: after its system prompt, kept whole when its history
is cut). A continuation (a turn resumed in another region) leaves out the
facts its original turn taught, so its prompt is the original's. End users list and delete their facts
through ``MemoryService`` (``/v1/memories`` at the edge), whatever the
policy says, so what was kept can always be removed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from llmmesh.region.knowledge.memory_store import MAX_FACTS_PER_USER, MemoryStore
from llmmesh.region.policy_cache import Caller
from llmmesh.v1 import chat_service_pb2, common_pb2

log = logging.getLogger(__name__)

MAX_FACTS_PER_TURN = 8
CONTEXT_FACTS = 20
MAX_FACT_CHARS = 300
_SYSTEM_ROLES = (common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_DEVELOPER)
_RULE_WORDS = frozenset({"as", "at", "for", "in", "like", "love", "prefer", "enjoy", "hate", "dislike"})
_PHRASE = r"([^.,;!?\n]{2,80})"
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), template)
    for pattern, template in (
        # Names are capitalised words: the case of the rest of the phrase is free.
        (r"\b(?i:my name is) ([A-Z][\w'-]*(?: [A-Z][\w'-]*){0,3})", "The user's name is {0}."),
        (r"\b(?i:call me) ([A-Z][\w'-]*(?: [A-Z][\w'-]*)?)", "The user wants to be called {0}."),
        (r"\b(?i:i live in) " + _PHRASE, "The user lives in {0}."),
        (r"\b(?i:i work (as|at|for|in)) " + _PHRASE, "The user works {0} {1}."),
        (r"\b(?i:i(?: am|'m) allergic to) " + _PHRASE, "The user is allergic to {0}."),
        (r"\b(?i:i (like|love|prefer|enjoy|hate|dislike)) " + _PHRASE, "The user {0}s {1}."),
        (r"\b(?i:remember that) ([^.!?\n]{3,200})", "The user asked to remember: {0}."),
    )
)


def extract_facts(texts: list[str]) -> list[str]:
    """The facts the rules find in ``texts``, each once, at most :data:`MAX_FACTS_PER_TURN`."""
    facts: dict[str, None] = {}
    for text in texts:
        for pattern, template in _RULES:
            for match in pattern.finditer(text):
                parts = [" ".join(g.split()) for g in match.groups()]
                # A rule's own words (its verb, its preposition) in lower case, whatever was typed.
                parts = [p.lower() if p.lower() in _RULE_WORDS else p for p in parts]
                fact = template.format(*parts)
                facts.setdefault(fact[:MAX_FACT_CHARS])
                if len(facts) == MAX_FACTS_PER_TURN:
                    return list(facts)
    return list(facts)


async def rules_extractor(tenant_id: str, texts: list[str]) -> list[str]:
    """:func:`extract_facts`, as an extractor (no model call: nothing to bill)."""
    return extract_facts(texts)


def facts_message(facts: list[str]) -> common_pb2.ChatMessage:
    lines = "\n".join(f"- {fact}" for fact in facts)
    return common_pb2.ChatMessage(
        role=common_pb2.CHAT_ROLE_SYSTEM,
        content=f"What you know about this user from earlier turns:\n{lines}",
    )


class UserMemory:
    """Learns facts after turns and recalls them into later ones."""

    def __init__(
        self,
        store: MemoryStore,
        extract: Callable[[str, list[str]], Awaitable[list[str]]] = rules_extractor,
    ) -> None:
        """``extract`` finds the facts in a turn's user messages, for its
        tenant (:mod:`region.knowledge.memory_model`)."""
        self.store = store
        self.extract = extract
        self._learning: set[asyncio.Task[None]] = set()

    @staticmethod
    def enabled(caller: Caller, start: chat_service_pb2.ChatStart) -> bool:
        return bool(caller.tenant.memory_enabled and start.user)

    async def recall_into(
        self,
        start: chat_service_pb2.ChatStart,
        caller: Caller,
        into: list[common_pb2.ChatMessage] | None = None,
    ) -> int:
        """Put the user's facts in the turn's messages (or in ``into``, a
        conversation turn's lead); how many."""
        if not self.enabled(caller, start):
            return 0
        try:
            page = await self.store.recall(caller.tenant_id, start.user, CONTEXT_FACTS)
        except Exception:
            # Memory is an aid: a store that cannot answer now costs the turn nothing.
            log.exception("turn %s: memory could not be read; the turn goes on without it", start.request_id)
            return 0
        taught = start.continuation.original_request_id if start.HasField("continuation") else None
        rows = [row for row in page.rows if row.source_request_id != taught]
        if not rows:
            return 0
        message = facts_message([row.content for row in reversed(rows)])
        if into is not None:
            into.append(message)
            return len(rows)
        lead = 0
        while lead < len(start.messages) and start.messages[lead].role in _SYSTEM_ROLES:
            lead += 1
        start.messages.insert(lead, message)
        return len(rows)

    def learn_soon(self, start: chat_service_pb2.ChatStart, caller: Caller, request_id: str) -> None:
        """Extract the turn's facts in the background, off the turn's path."""
        if not self.enabled(caller, start):
            return
        said = [m.content for m in start.messages if m.role == common_pb2.CHAT_ROLE_USER]
        if not any(text.strip() for text in said):
            return
        most = caller.tenant.max_memories_per_user or MAX_FACTS_PER_USER
        task = asyncio.create_task(self._learn(caller.tenant_id, start.user, said, request_id, most))
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    async def _learn(self, tenant_id: str, user: str, said: list[str], request_id: str, most: int) -> None:
        try:
            facts = await self.extract(tenant_id, said)
            if not facts:
                return
            new = await self.store.remember(tenant_id, user, facts, request_id, most)
            log.info("turn %s: %d new facts about an end user of tenant %s", request_id, new, tenant_id)
        except Exception:
            log.exception("turn %s: facts could not be kept", request_id)

    async def drain(self) -> None:
        """Wait for the facts being written."""
        if self._learning:
            await asyncio.gather(*self._learning, return_exceptions=True)
