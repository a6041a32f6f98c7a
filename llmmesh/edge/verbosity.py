"""``verbosity`` (chat completions) and ``text.verbosity`` (responses),
honoured as an instruction to the model.

No model of the mesh has a length control of its own, so the requested
verbosity becomes a developer message after the request's leading system
and developer messages: ``low`` asks for a brief answer, ``high`` for a
thorough one, and ``medium`` (the default) adds nothing. A developer
message, not a system one, so that a conversation's stored system prompt
still applies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from llmmesh.v1 import common_pb2

Verbosity = Literal["low", "medium", "high"]

INSTRUCTIONS: dict[str, str] = {
    "low": "Answer briefly: give only what the question needs, in as few words as it takes.",
    "medium": "",
    "high": "Answer thoroughly: explain your reasoning and give detail and examples where they help.",
}
"""The instruction each verbosity adds."""

_LEADING = frozenset({common_pb2.CHAT_ROLE_SYSTEM, common_pb2.CHAT_ROLE_DEVELOPER})


def with_verbosity(
    messages: Sequence[common_pb2.ChatMessage], verbosity: Verbosity | None
) -> list[common_pb2.ChatMessage]:
    """``messages`` with the instruction of ``verbosity`` after their leading
    system and developer messages (unchanged for none or ``medium``)."""
    out = list(messages)
    instruction = INSTRUCTIONS[verbosity] if verbosity is not None else ""
    if not instruction:
        return out
    at = 0
    while at < len(out) and out[at].role in _LEADING:
        at += 1
    out.insert(at, common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_DEVELOPER, content=instruction))
    return out
