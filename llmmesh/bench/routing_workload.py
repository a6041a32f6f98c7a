"""The seeded workload of ``llmmesh bench routing``: tenants, each with its
own long system prompt, holding multi-turn conversations whose history
grows turn by turn; and the sizing of the engines' KV cache against it.

Each tenant's system prompt opens with the tenant's name, so no two tenants
share even the first KV block. A conversation of ``turns_per_conversation``
turns sends, at turn k, the system prompt, the k-1 earlier exchanges and a
new user message. The assistant messages of the history are fixed stand-in
replies drawn from the seed, not what an engine happened to generate, so
every system sees exactly the same prompts whatever it produced; a turn's
prompt therefore extends the previous turn's prompt, which is what the
prefix cache can reuse. The conversations of all tenants are interleaved in
one seeded order.

KV pressure (:class:`KvSizing`) compares the workload's working set with the
cluster's KV cache: every tenant's shared prefix, plus the private tail
(history past the system prompt, and the reply) of one live conversation per
concurrent user at its longest. With the default workload the shared
prefixes alone exceed one pod's cache while the working set fills about
70% of the cluster's, so which pod a turn goes to decides whether its
prefix is still cached there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from llmmesh.bench.workload import DEFAULT_SEED, sentences
from llmmesh.engine.sim.tokenizer import SimTokenizer
from llmmesh.engine.sim.vocabulary import WORDS

Message = tuple[str, str]
"""A chat message as ``(role, content)``, role ``system``, ``user`` or ``assistant``."""

TokenCounter = Callable[[Sequence[Message], bool], int]
"""Prompt tokens of chat ``messages``, with the assistant opener when the flag is set."""


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: the messages the system receives (the
    whole history, as a stateless chat completion carries it) and how many
    tokens to generate (always all of them: ``ignore_eos``)."""

    turn_id: str
    tenant: int
    messages: tuple[Message, ...]
    max_tokens: int


@dataclass(frozen=True)
class Conversation:
    """The turns of one conversation, sent one after the other."""

    conversation_id: str
    tenant: int
    turns: tuple[Turn, ...]


class ConversationWorkload(Protocol):
    """What the benchmark runs of a workload: its conversations by phase
    (``count`` per tenant or kind; None for the workload's own), its size
    and a JSON-ready description."""

    @property
    def turns_total(self) -> int: ...

    def describe(self) -> dict[str, object]: ...

    def conversations(self, phase: str, count: int | None = None, /) -> list[Conversation]: ...


@dataclass(frozen=True)
class RoutingWorkload:
    """A deterministic multi-tenant, multi-turn chat workload; see the
    module docstring. Lengths are in words of the simulator's vocabulary
    (about one token each with the simulator's tokenizer and llmmesh-tiny's)."""

    seed: int = DEFAULT_SEED
    tenants: int = 8
    system_words: int = 1200
    conversations_per_tenant: int = 6
    turns_per_conversation: int = 4
    user_words: tuple[int, int] = (40, 80)
    reply_words: int = 64
    max_tokens: int = 64
    vocabulary: Sequence[str] = WORDS

    def __post_init__(self) -> None:
        low, high = self.user_words
        if not 1 <= low <= high:
            raise ValueError(f"user_words must be a range of positive lengths, got {self.user_words}")
        for name in (
            "tenants",
            "system_words",
            "conversations_per_tenant",
            "turns_per_conversation",
            "reply_words",
            "max_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not self.vocabulary:
            raise ValueError("the vocabulary must not be empty")

    def describe(self) -> dict[str, object]:
        """The workload's parameters, JSON-ready."""
        return {
            "seed": self.seed,
            "tenants": self.tenants,
            "system_words": self.system_words,
            "conversations_per_tenant": self.conversations_per_tenant,
            "turns_per_conversation": self.turns_per_conversation,
            "user_words": list(self.user_words),
            "reply_words": self.reply_words,
            "max_tokens": self.max_tokens,
        }

    @property
    def turns_total(self) -> int:
        return self.tenants * self.conversations_per_tenant * self.turns_per_conversation

    @cached_property
    def system_prompts(self) -> tuple[str, ...]:
        """Each tenant's system prompt, tenant 0 first."""
        prompts = []
        for tenant in range(self.tenants):
            rng = random.Random(f"{self.seed}/tenant/{tenant}")
            opener = f"Tenant {tenant} assistant. Answer for tenant {tenant} only."
            prompts.append(f"{opener} {self._sentences(rng, self.system_words)}")
        return tuple(prompts)

    def conversations(self, phase: str, per_tenant: int | None = None) -> list[Conversation]:
        """The conversations of ``phase`` (e.g. ``"measure"`` or ``"warmup"``),
        ``per_tenant`` of each tenant (default ``conversations_per_tenant``),
        in one seeded interleaved order. Different phases get different user
        messages and stand-in replies; the system prompts are the tenants'."""
        count = self.conversations_per_tenant if per_tenant is None else per_tenant
        if count < 0:
            raise ValueError("per_tenant must not be negative")
        order = [(tenant, index) for tenant in range(self.tenants) for index in range(count)]
        random.Random(f"{self.seed}/{phase}/order").shuffle(order)
        return [self._conversation(phase, tenant, index) for tenant, index in order]

    def _conversation(self, phase: str, tenant: int, index: int) -> Conversation:
        conversation_id = f"{phase}-t{tenant}-c{index}"
        rng = random.Random(f"{self.seed}/{conversation_id}")
        history: list[Message] = [("system", self.system_prompts[tenant])]
        turns: list[Turn] = []
        for number in range(self.turns_per_conversation):
            history.append(("user", self._sentences(rng, rng.randint(*self.user_words))))
            turns.append(Turn(f"{conversation_id}-{number}", tenant, tuple(history), self.max_tokens))
            history.append(("assistant", self._sentences(rng, self.reply_words)))
        return Conversation(conversation_id, tenant, tuple(turns))

    def _sentences(self, rng: random.Random, words: int) -> str:
        return sentences(rng, self.vocabulary, words)


def sim_token_counter() -> TokenCounter:
    """Counts prompt tokens as the simulator's chat template renders them."""
    tokenizer = SimTokenizer()

    def count(messages: Sequence[Message], add_generation_prompt: bool) -> int:
        return len(tokenizer.render_chat(messages, add_generation_prompt))

    return count


@dataclass(frozen=True)
class WorkingSet:
    """Tokens the workload keeps in KV cache at its peak: every tenant's
    system prompt, and one live conversation's private tail per concurrent
    user."""

    shared_prefix_tokens: int
    live_conversation_tokens: int
    longest_turn_tokens: int

    @property
    def tokens(self) -> int:
        return self.shared_prefix_tokens + self.live_conversation_tokens


def working_set(workload: RoutingWorkload, concurrency: int, count: TokenCounter) -> WorkingSet:
    """The working set of ``workload`` with ``concurrency`` users: the system
    prompts as rendered on their own, and ``concurrency`` times the mean
    private tail of a conversation at its last turn (its prompt past the
    system prompt plus its reply). ``longest_turn_tokens`` is the longest
    prompt plus reply, which must fit the model's context window."""
    if concurrency < 1:
        raise ValueError("concurrency must be positive")
    shared = [count([("system", prompt)], False) for prompt in workload.system_prompts]
    conversations = workload.conversations("measure")
    tails: list[int] = []
    longest = 0
    for conversation in conversations:
        last = conversation.turns[-1]
        total = count(last.messages, True) + last.max_tokens
        longest = max(longest, total)
        tails.append(total - shared[conversation.tenant])
    mean_tail = sum(tails) / len(tails) if tails else 0.0
    return WorkingSet(
        shared_prefix_tokens=sum(shared),
        live_conversation_tokens=math.ceil(concurrency * mean_tail),
        longest_turn_tokens=longest,
    )


def blocks_for_pressure(working_set_tokens: int, pods: int, block_size: int, pressure: float) -> int:
    """KV blocks per pod such that ``working_set_tokens`` fill ``pressure``
    of ``pods`` pods' caches (rounded up to whole blocks, at least one)."""
    if pods < 1 or block_size < 1 or not pressure > 0.0:
        raise ValueError("pods and block_size must be positive and pressure above 0")
    return max(1, math.ceil(working_set_tokens / (pressure * pods * block_size)))


@dataclass(frozen=True)
class KvSizing:
    """The engines' KV cache against the workload's working set."""

    pods: int
    block_size: int
    kv_blocks_per_pod: int
    working: WorkingSet

    @property
    def pod_kv_tokens(self) -> int:
        return self.kv_blocks_per_pod * self.block_size

    @property
    def cluster_kv_tokens(self) -> int:
        return self.pods * self.pod_kv_tokens

    @property
    def kv_pressure(self) -> float:
        """Working set over the cluster's KV cache."""
        return self.working.tokens / self.cluster_kv_tokens

    @property
    def shared_prefix_over_pod_kv(self) -> float:
        """All tenants' system prompts over one pod's KV cache: above 1, no
        single pod can keep every tenant's prefix."""
        return self.working.shared_prefix_tokens / self.pod_kv_tokens

    def as_dict(self) -> dict[str, object]:
        return {
            "pods": self.pods,
            "block_size": self.block_size,
            "kv_blocks_per_pod": self.kv_blocks_per_pod,
            "pod_kv_tokens": self.pod_kv_tokens,
            "cluster_kv_tokens": self.cluster_kv_tokens,
            "shared_prefix_tokens": self.working.shared_prefix_tokens,
            "live_conversation_tokens": self.working.live_conversation_tokens,
            "working_set_tokens": self.working.tokens,
            "longest_turn_tokens": self.working.longest_turn_tokens,
            "kv_pressure": round(self.kv_pressure, 4),
            "shared_prefix_over_pod_kv": round(self.shared_prefix_over_pod_kv, 4),
        }
