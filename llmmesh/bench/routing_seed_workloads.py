"""Two more workloads of ``llmmesh bench routing`` from the seed write-ups:
long-context RAG and agentic multi-turn (the chat with shared system
prompts is :mod:`llmmesh.bench.routing_workload`'s ``prefix-reuse``).

``rag``: each tenant has a short system prompt and a corpus of
``documents_per_tenant`` documents of about ``document_words`` words. A
conversation asks ``turns_per_conversation`` questions; each turn's prompt
is the system prompt, the ``retrieved`` documents retrieval ranked for it
(drawn by a Zipf-like popularity, so a few documents come first often),
the history and the question. Turns share the system prompt and, when they
retrieved the same top document, that document too; a follow-up extends
its own conversation's prompt. Long prompts, short replies: prefill
dominates and a miss costs thousands of tokens.

``agentic``: each tenant's agent has a long system prompt (instructions and
tool definitions). A conversation is a task of ``turns_per_conversation``
steps; each step appends the model's tool call (a stand-in, short) and the
tool's result (``tool_result_words``), and asks for the next call. Replies
are short and the history grows step by step, so a conversation's own
prefix, more than its tenant's, is what the cache reuses.

Both are deterministic in the seed, like the chat workload: stand-in
replies, not what an engine generated, so every system sees the same
prompts. Lengths are in words of the simulator's vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from llmmesh.bench.plan import SIM_ROUTING, RoutingBackendPlan
from llmmesh.bench.routing_workload import Conversation, Message, TokenCounter, Turn, WorkingSet
from llmmesh.bench.workload import DEFAULT_SEED, sentences
from llmmesh.engine.sim.vocabulary import WORDS

RAG = "rag"
AGENTIC = "agentic"


def _text(rng: random.Random, words: int) -> str:
    return sentences(rng, WORDS, words)


def _interleaved(
    tenants: int, per_tenant: int, order_seed: str, conversation: Callable[[int, int], Conversation]
) -> list[Conversation]:
    """``per_tenant`` conversations of every tenant in one seeded order."""
    order = [(tenant, index) for tenant in range(tenants) for index in range(per_tenant)]
    random.Random(order_seed).shuffle(order)
    return [conversation(tenant, index) for tenant, index in order]


@dataclass(frozen=True)
class RagWorkload:
    """Long-context RAG; see the module docstring."""

    seed: int = DEFAULT_SEED
    tenants: int = 8
    system_words: int = 150
    documents_per_tenant: int = 24
    document_words: int = 500
    retrieved: int = 3
    conversations_per_tenant: int = 6
    turns_per_conversation: int = 2
    question_words: tuple[int, int] = (15, 40)
    max_tokens: int = 32

    @classmethod
    def of(cls, plan: RoutingBackendPlan) -> RagWorkload:
        return cls(
            tenants=plan.tenants,
            conversations_per_tenant=plan.conversations_per_tenant,
            turns_per_conversation=plan.turns_per_conversation,
            max_tokens=plan.max_tokens,
        )

    @property
    def turns_total(self) -> int:
        return self.tenants * self.conversations_per_tenant * self.turns_per_conversation

    def describe(self) -> dict[str, object]:
        return {"kind": RAG, **{k: v for k, v in dataclasses.asdict(self).items() if k != "question_words"}}

    @cached_property
    def _corpus(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Per tenant, its system prompt and its documents."""
        tenants = []
        for tenant in range(self.tenants):
            rng = random.Random(f"{self.seed}/rag/{tenant}")
            system = (
                f"Tenant {tenant} research assistant. Cite the documents. {_text(rng, self.system_words)}"
            )
            documents = tuple(
                f"Document {tenant}-{d}. {_text(rng, self.document_words)}"
                for d in range(self.documents_per_tenant)
            )
            tenants.append((system, documents))
        return tuple(tenants)

    def conversations(self, phase: str, per_tenant: int | None = None) -> list[Conversation]:
        count = self.conversations_per_tenant if per_tenant is None else per_tenant
        return _interleaved(
            self.tenants,
            count,
            f"{self.seed}/rag/{phase}/order",
            lambda t, i: self._conversation(phase, t, i),
        )

    def _conversation(self, phase: str, tenant: int, index: int) -> Conversation:
        conversation_id = f"{phase}-t{tenant}-c{index}"
        rng = random.Random(f"{self.seed}/rag/{conversation_id}")
        system, documents = self._corpus[tenant]
        weights = [1.0 / (rank + 1) for rank in range(len(documents))]
        picked: list[int] = []
        while len(picked) < min(self.retrieved, len(documents)):
            choice = rng.choices(range(len(documents)), weights)[0]
            if choice not in picked:
                picked.append(choice)
        context = "\n\n".join(documents[d] for d in picked)
        history: list[Message] = [("system", f"{system}\n\n{context}")]
        turns = []
        for number in range(self.turns_per_conversation):
            history.append(("user", _text(rng, rng.randint(*self.question_words))))
            turns.append(Turn(f"{conversation_id}-{number}", tenant, tuple(history), self.max_tokens))
            history.append(("assistant", _text(rng, self.max_tokens)))
        return Conversation(conversation_id, tenant, tuple(turns))

    def working_set(self, concurrency: int, count: TokenCounter) -> WorkingSet:
        """Shared: every tenant's system prompt and its most popular
        document; live: ``concurrency`` conversations' prompts past that."""
        shared = [
            count([("system", f"{system}\n\n{documents[0]}")], False) for system, documents in self._corpus
        ]
        return _working_set(self.conversations("measure"), shared, concurrency, count)


@dataclass(frozen=True)
class AgenticWorkload:
    """Agentic multi-turn tasks; see the module docstring."""

    seed: int = DEFAULT_SEED
    tenants: int = 4
    system_words: int = 1200
    conversations_per_tenant: int = 6
    turns_per_conversation: int = 8
    tool_result_words: tuple[int, int] = (60, 160)
    call_words: int = 12
    max_tokens: int = 16

    @classmethod
    def of(cls, plan: RoutingBackendPlan) -> AgenticWorkload:
        return cls(
            tenants=plan.tenants,
            system_words=plan.system_words,
            conversations_per_tenant=plan.conversations_per_tenant,
            turns_per_conversation=plan.turns_per_conversation,
            max_tokens=plan.max_tokens,
        )

    @property
    def turns_total(self) -> int:
        return self.tenants * self.conversations_per_tenant * self.turns_per_conversation

    def describe(self) -> dict[str, object]:
        return {
            "kind": AGENTIC,
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "tool_result_words"},
        }

    @cached_property
    def _system_prompts(self) -> tuple[str, ...]:
        prompts = []
        for tenant in range(self.tenants):
            rng = random.Random(f"{self.seed}/agent/{tenant}")
            prompts.append(
                f"Tenant {tenant} agent. Tools: search, read, write. {_text(rng, self.system_words)}"
            )
        return tuple(prompts)

    def conversations(self, phase: str, per_tenant: int | None = None) -> list[Conversation]:
        count = self.conversations_per_tenant if per_tenant is None else per_tenant
        return _interleaved(
            self.tenants,
            count,
            f"{self.seed}/agent/{phase}/order",
            lambda t, i: self._conversation(phase, t, i),
        )

    def _conversation(self, phase: str, tenant: int, index: int) -> Conversation:
        conversation_id = f"{phase}-t{tenant}-c{index}"
        rng = random.Random(f"{self.seed}/agent/{conversation_id}")
        history: list[Message] = [
            ("system", self._system_prompts[tenant]),
            ("user", f"Task: {_text(rng, 40)}"),
        ]
        turns = []
        for number in range(self.turns_per_conversation):
            turns.append(Turn(f"{conversation_id}-{number}", tenant, tuple(history), self.max_tokens))
            history.append(("assistant", f"call {_text(rng, self.call_words)}"))
            history.append(("user", f"result {_text(rng, rng.randint(*self.tool_result_words))}"))
        return Conversation(conversation_id, tenant, tuple(turns))

    def working_set(self, concurrency: int, count: TokenCounter) -> WorkingSet:
        """Shared: every tenant's system prompt; live: ``concurrency``
        tasks at their last step."""
        shared = [count([("system", prompt)], False) for prompt in self._system_prompts]
        return _working_set(self.conversations("measure"), shared, concurrency, count)


def _working_set(
    conversations: list[Conversation], shared: list[int], concurrency: int, count: TokenCounter
) -> WorkingSet:
    tails: list[int] = []
    longest = 0
    for conversation in conversations:
        last = conversation.turns[-1]
        total = count(last.messages, True) + last.max_tokens
        longest = max(longest, total)
        tails.append(total - shared[conversation.tenant])
    mean_tail = sum(tails) / len(tails) if tails else 0.0
    return WorkingSet(sum(shared), math.ceil(concurrency * mean_tail), longest)


# ``--workload rag``: 8 tenants, prompts of about 1,700 tokens (3 of 24
# documents of 500 words each) and 2 questions per conversation.
SIM_RAG = dataclasses.replace(
    SIM_ROUTING,
    workload=RAG,
    tenants=8,
    conversations_per_tenant=6,
    turns_per_conversation=2,
    disaggregated=(),
)
# ``--workload agentic``: 4 agents' long system prompts, 8-step tasks.
SIM_AGENTIC = dataclasses.replace(
    SIM_ROUTING,
    workload=AGENTIC,
    tenants=4,
    system_words=1200,
    conversations_per_tenant=6,
    turns_per_conversation=8,
    max_tokens=16,
    disaggregated=(),
)
