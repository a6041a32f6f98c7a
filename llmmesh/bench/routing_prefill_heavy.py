"""The ``prefill-heavy`` workload of ``llmmesh bench routing``: where
disaggregated prefill and decode is known to matter.

Two kinds of single-turn conversations, interleaved in one seeded order:
documents (long unique prompts, about ``system_words`` words each, give or
take a quarter, with a short reply of :data:`SUMMARY_TOKENS`: prefill
heavy) and chats (a short question with a long reply of ``max_tokens``:
decode heavy). No two prompts share a KV block, so the prefix cache gives
nothing and no routing policy can avoid computing every document.

On whole-turn pods a document's prefill shares engine steps with the
chats decoding there. The simulator's scheduler is vLLM v1's (always
chunked prefill): decodes are scheduled first, then prompt chunks fill the
rest of the step's token budget (``max_num_batched_tokens``, 2048), and a
step costs its decode part plus ``sim_prefill_per_token_s`` per prompt
token computed (:mod:`engine.sim.timing`). A 1,600-token document therefore
lengthens one step of every chat on its pod by about 0.2 s: chunking bounds
the stall by the token budget (a smaller budget splits it over more,
shorter steps) but does not remove it. On prefill and decode pods the
decode pods run no prompt chunks (only the few tokens after a prompt's
last full block), so chats decode undisturbed, at the price of half the
pods computing prompts and a KV transfer per turn.

What ITL percentiles can show: an ITL sample is one token, and a stall
costs each chat on the pod one slow step, so a prefill shows in ITL p90
only when more than one decode step in ten carries prompt chunks; below a
pod's prefill saturation the stalls live in the tail (ITL p99), in the
chats' total time and in throughput. The report gives ITL p90 and p99.

The pods' KV cache is a hardware given, not the workload's: by default each
pod holds a full batch (``max_num_seqs``) of the longest turn, so batch
slots, not KV blocks, bound a pod, as on a GPU serving an 8B-class model.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from llmmesh.bench.plan import SIM_ROUTING, RoutingBackendPlan
from llmmesh.bench.routing_workload import Conversation, Message, TokenCounter, Turn, WorkingSet
from llmmesh.bench.workload import DEFAULT_SEED, sentences
from llmmesh.engine.sim.vocabulary import WORDS

PREFILL_HEAVY = "prefill-heavy"
SUMMARY_TOKENS = 16
CHAT_WORDS = (20, 60)
# Tenant numbers in the per-turn trace: which kind a turn is.
DOCUMENT, CHAT = 0, 1

# ``--workload prefill-heavy``: 24 documents of about 1,600 words and 24
# chats of 256-token replies, 16 users on 4 pods (8 batch slots each), the
# precise policy with and without prefill and decode pods.
SIM_PREFILL_HEAVY = dataclasses.replace(
    SIM_ROUTING,
    workload=PREFILL_HEAVY,
    policies=("precise",),
    tenants=1,
    conversations_per_tenant=24,
    turns_per_conversation=1,
    system_words=1600,
    max_tokens=256,
)
# With --quick: 16 of each, 8 users.
QUICK_SIM_PREFILL_HEAVY = dataclasses.replace(SIM_PREFILL_HEAVY, concurrency=8, conversations_per_tenant=16)


@dataclass(frozen=True)
class PrefillHeavyWorkload:
    """``documents`` document turns and as many chat turns; see the module
    docstring. Lengths in words of the simulator's vocabulary (about a
    token each)."""

    documents: int
    document_words: tuple[int, int]
    reply_tokens: int
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        low, high = self.document_words
        if self.documents < 1 or self.reply_tokens < 1 or not 1 <= low <= high:
            raise ValueError("documents, reply tokens and document lengths must be positive")

    @classmethod
    def of(cls, plan: RoutingBackendPlan) -> PrefillHeavyWorkload:
        """The workload a plan asks for: ``tenants * conversations_per_tenant``
        documents (and chats), documents of ``system_words`` words give or
        take a quarter, chat replies of ``max_tokens``."""
        words = plan.system_words
        return cls(
            documents=plan.tenants * plan.conversations_per_tenant,
            document_words=(max(1, words * 3 // 4), max(1, words * 5 // 4)),
            reply_tokens=plan.max_tokens,
        )

    @property
    def turns_total(self) -> int:
        return 2 * self.documents

    def describe(self) -> dict[str, object]:
        return {
            "kind": PREFILL_HEAVY,
            "seed": self.seed,
            "documents": self.documents,
            "document_words": list(self.document_words),
            "summary_tokens": SUMMARY_TOKENS,
            "chats": self.documents,
            "chat_words": list(CHAT_WORDS),
            "reply_tokens": self.reply_tokens,
        }

    def conversations(self, phase: str, per_kind: int | None = None) -> list[Conversation]:
        """The turns of ``phase``, ``per_kind`` documents and as many chats
        (default ``documents``), each its own conversation, in one seeded
        order; phases never share a prompt."""
        count = self.documents if per_kind is None else per_kind
        if count < 0:
            raise ValueError("per_kind must not be negative")
        order = [(kind, index) for kind in (DOCUMENT, CHAT) for index in range(count)]
        random.Random(f"{self.seed}/{phase}/prefill-heavy").shuffle(order)
        return [self._conversation(phase, kind, index) for kind, index in order]

    def _conversation(self, phase: str, kind: int, index: int) -> Conversation:
        name = "doc" if kind == DOCUMENT else "chat"
        conversation_id = f"{phase}-{name}-{index}"
        rng = random.Random(f"{self.seed}/{conversation_id}")
        if kind == DOCUMENT:
            document = sentences(rng, WORDS, rng.randint(*self.document_words))
            # The document first: no two prompts share even their first block.
            messages: tuple[Message, ...] = (("user", f"{document} Summarise the document above."),)
            max_tokens = SUMMARY_TOKENS
        else:
            question = sentences(rng, WORDS, rng.randint(*CHAT_WORDS))
            messages = (("user", f"{question} Answer at length."),)
            max_tokens = self.reply_tokens
        turn = Turn(f"{conversation_id}-0", kind, messages, max_tokens)
        return Conversation(conversation_id, kind, (turn,))

    def working_set(self, concurrency: int, count: TokenCounter) -> WorkingSet:
        """Nothing shared; ``concurrency`` live turns of the mean length
        (prompt and reply); the longest turn."""
        if concurrency < 1:
            raise ValueError("concurrency must be positive")
        lengths = [
            count(turn.messages, True) + turn.max_tokens
            for conversation in self.conversations("measure")
            for turn in conversation.turns
        ]
        return WorkingSet(0, math.ceil(concurrency * sum(lengths) / len(lengths)), max(lengths))


def batch_kv_blocks(longest_turn_tokens: int, max_num_seqs: int, block_size: int) -> int:
    """KV blocks for a full batch of the longest turn."""
    return math.ceil(longest_turn_tokens / block_size) * max_num_seqs
