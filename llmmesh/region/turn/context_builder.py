"""The context builder: a system prompt, a conversation's history and the new
message(s) fitted into a model's context window, counted in the engine's own
tokens.

The system message(s) and the new messages are always sent. History is
dropped oldest first in whole turns (a user message with the replies that
follow it), so what the engine sees after the system prompt never opens
with a reply to a question it cannot see. Chat templates add tokens per
message and around the whole prompt, so candidates are counted whole, never
as sums of per-message counts; a binary search over how many turns to drop
keeps a long history at O(log n) tokenizer calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.v1 import common_pb2

ChatMessage = common_pb2.ChatMessage
Turn = tuple[common_pb2.ChatMessage, ...]
TokenCounter = Callable[[Sequence[common_pb2.ChatMessage]], Awaitable[int]]

MIN_OUTPUT_TOKENS = 1
"""Room always kept for the reply when a turn sets no ``max_tokens``: the
engine must be able to produce at least one token, and the gateway caps an
unset ``max_tokens`` by whatever room the fitted prompt leaves, so reserving
more would drop history the reply does not need."""

_SYSTEM_ROLES = frozenset({common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_DEVELOPER})


@dataclass(frozen=True)
class FittedContext:
    """What goes to the engine for one turn."""

    # System messages, the history kept, then the new messages.
    messages: tuple[common_pb2.ChatMessage, ...]
    # Their token count as the engine counts it.
    prompt_tokens: int
    # History messages left out, oldest first.
    dropped_messages: int


def split_turns(messages: Sequence[ChatMessage]) -> tuple[Turn, list[Turn]]:
    """A flat message list as (its leading system and developer messages, the rest in turns).

    A turn starts at a user message and holds every message up to the next
    user message. Messages before the first user message (a reply whose
    question was not kept) form a turn of their own, the first one dropped.
    """
    lead = 0
    while lead < len(messages) and messages[lead].role in _SYSTEM_ROLES:
        lead += 1
    turns: list[list[ChatMessage]] = []
    for message in messages[lead:]:
        if not turns or message.role == common_pb2.CHAT_ROLE_USER:
            turns.append([message])
        else:
            turns[-1].append(message)
    return tuple(messages[:lead]), [tuple(turn) for turn in turns]


async def fit_context(
    system: Sequence[ChatMessage],
    history: Sequence[ChatMessage],
    new: Sequence[ChatMessage],
    *,
    window_tokens: int,
    reserve_output_tokens: int,
    count_tokens: TokenCounter,
) -> FittedContext:
    """The longest suffix of ``history`` in whole turns such that
    ``prompt_tokens + reserve_output_tokens <= window_tokens``.

    ``reserve_output_tokens`` is the turn's ``max_tokens`` when set; a value
    below :data:`MIN_OUTPUT_TOKENS` counts as that. ``count_tokens`` counts
    a whole message list exactly as the engine renders and tokenizes it;
    the binary search relies on dropping a turn never adding tokens. It is
    called at most ``2 + ceil(log2(turns))`` times, once when everything
    fits. A history kept whole is sent as given, even when it opens with a
    reply; any shorter one starts at a user message.

    Raises INVALID_ARGUMENT ``PROMPT_TOO_LONG`` (``param`` ``messages``)
    when the system and new messages alone leave no room for the reply.
    """
    if window_tokens <= 0:
        raise ValueError("window_tokens must be positive")
    reserve = max(reserve_output_tokens, MIN_OUTPUT_TOKENS)
    budget = window_tokens - reserve
    _, turns = split_turns(history)
    # starts[k]: where the history kept after dropping k turns begins.
    starts = [0]
    for turn in turns:
        starts.append(starts[-1] + len(turn))

    async def count(dropped_turns: int) -> int:
        kept = history[starts[dropped_turns] :]
        return await count_tokens([*system, *kept, *new])

    def fitted(dropped_turns: int, tokens: int) -> FittedContext:
        kept = history[starts[dropped_turns] :]
        return FittedContext((*system, *kept, *new), tokens, starts[dropped_turns])

    tokens = await count(0)
    if tokens <= budget:
        return fitted(0, tokens)
    # Fits: the fewest turns dropped known to fit; too_few: the most known not to.
    fits, too_few = len(turns), 0
    fits_tokens = tokens if not turns else await count(fits)
    if fits_tokens > budget:
        raise InvalidArgument(
            Reason.PROMPT_TOO_LONG,
            f"the system and new messages take {fits_tokens} tokens and the reply needs {reserve} more, "
            f"but the model's context window is {window_tokens} tokens",
            metadata={"param": "messages"},
        )
    while fits - too_few > 1:
        middle = (fits + too_few) // 2
        middle_tokens = await count(middle)
        if middle_tokens <= budget:
            fits, fits_tokens = middle, middle_tokens
        else:
            too_few = middle
    return fitted(fits, fits_tokens)
