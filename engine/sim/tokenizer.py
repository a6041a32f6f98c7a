"""The simulator's tokenizer: word-level pieces from a fixed vocabulary with
byte fallback, and a chat template with role markers.

Contract: ``decode(encode(text)) == text`` for every string without lone
surrogates (those are not valid UTF-8, nor valid protobuf strings; they
encode as ``?``). Ids never depend on the process: they are positions in
:mod:`engine.sim.vocabulary`. A word outside the vocabulary falls back to
one token per UTF-8 byte, as SentencePiece's byte fallback does, so it has
stable ids and still decodes exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from engine.sim.vocabulary import BYTE_OFFSET, PIECE_OFFSET, PIECES, SPECIAL_TOKENS, VOCAB_SIZE

# GPT-2-style pre-tokenization: an optional leading space joins the word,
# digit or mark after it. Every character matches one alternative, so the
# pieces partition the text exactly.
_PIECE_PATTERN = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s")

ROLES: tuple[str, ...] = ("system", "user", "assistant", "developer", "tool")


class SimTokenizer:
    """Encodes and decodes text; renders chat turns. Stateless and cheap."""

    vocab_size = VOCAB_SIZE
    bos_id = SPECIAL_TOKENS.index("<s>")
    eos_id = SPECIAL_TOKENS.index("</s>")
    end_of_turn_id = SPECIAL_TOKENS.index("<|end|>")

    def __init__(self) -> None:
        self._piece_ids = {piece: PIECE_OFFSET + index for index, piece in enumerate(PIECES)}
        self._role_ids = {role: SPECIAL_TOKENS.index(f"<|{role}|>") for role in ROLES}

    def piece_id(self, piece: str) -> int:
        """The id of one vocabulary piece; KeyError if it is not one."""
        return self._piece_ids[piece]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        ids: list[int] = []
        for match in _PIECE_PATTERN.finditer(text):
            piece = match.group()
            known = self._piece_ids.get(piece)
            if known is not None:
                ids.append(known)
            else:
                ids.extend(BYTE_OFFSET + byte for byte in piece.encode("utf-8", errors="replace"))
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """A plain-text prompt as a generation sees it: BOS, then the text."""
        return [self.bos_id, *self.encode(text)]

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        """Chat turns ``(role, content)`` rendered as
        ``<s><|role|>content<|end|>…`` and, when asked, the assistant opener
        ``<|assistant|>``. Raises ValueError for an unknown role."""
        ids = [self.bos_id]
        for role, content in turns:
            role_id = self._role_ids.get(role)
            if role_id is None:
                raise ValueError(f"unknown chat role {role!r}; expected one of {', '.join(ROLES)}")
            ids.append(role_id)
            ids.extend(self.encode(content))
            ids.append(self.end_of_turn_id)
        if add_generation_prompt:
            ids.append(self._role_ids["assistant"])
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``; raises ValueError for an id outside the vocabulary."""
        parts: list[str] = []
        pending = bytearray()
        for token_id in token_ids:
            if not 0 <= token_id < VOCAB_SIZE:
                raise ValueError(f"token id {token_id} is outside the vocabulary of {VOCAB_SIZE}")
            if BYTE_OFFSET <= token_id < PIECE_OFFSET:
                pending.append(token_id - BYTE_OFFSET)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if token_id < BYTE_OFFSET:
                if not skip_special_tokens:
                    parts.append(SPECIAL_TOKENS[token_id])
            else:
                parts.append(PIECES[token_id - PIECE_OFFSET])
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)
