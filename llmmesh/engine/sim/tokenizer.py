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

from collections.abc import Sequence

from llmmesh.core.chat_tokenizer import PieceTokenizer, PieceTokenizerSpec
from llmmesh.engine.sim.vocabulary import BYTE_OFFSET, PIECE_OFFSET, PIECES, SPECIAL_TOKENS, VOCAB_SIZE

# GPT-2-style pre-tokenization: an optional leading space joins the word,
# digit or mark after it. Every character matches one alternative, so the
# pieces partition the text exactly.
PIECE_PATTERN = r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s"

ROLES: tuple[str, ...] = ("system", "user", "assistant", "developer", "tool")

SPEC = PieceTokenizerSpec(
    pieces=PIECES,
    piece_offset=PIECE_OFFSET,
    byte_offset=BYTE_OFFSET,
    pattern=PIECE_PATTERN,
    bos_id=SPECIAL_TOKENS.index("<s>"),
    end_of_turn_id=SPECIAL_TOKENS.index("<|end|>"),
    role_ids={role: SPECIAL_TOKENS.index(f"<|{role}|>") for role in ROLES},
)
"""The tokenizer as the pod publishes it (``GetTokenizer``): a region runs
the same :class:`PieceTokenizer` on it and gets the same ids."""


class SimTokenizer(PieceTokenizer):
    """Encodes and decodes text; renders chat turns
    (``<s><|role|>content<|end|>…`` and, when asked, ``<|assistant|>``).
    Stateless and cheap."""

    vocab_size = VOCAB_SIZE
    bos_id = SPEC.bos_id
    eos_id = SPECIAL_TOKENS.index("</s>")
    end_of_turn_id = SPEC.end_of_turn_id

    def __init__(self) -> None:
        super().__init__(SPEC)

    def encode_prompt(self, text: str) -> list[int]:
        """A plain-text prompt as a generation sees it: BOS, then the text."""
        return [self.bos_id, *self.encode(text)]

    def last_user_message(self, prompt_token_ids: Sequence[int]) -> str | None:
        """The text of the last user message of a rendered chat (the whole
        text of a prompt that is not one), None when a tool message follows it."""
        text = self.decode(prompt_token_ids)
        start = text.rfind("<|user|>")
        if start < 0:
            return text
        text = text[start + len("<|user|>") :]
        end = text.find("<|end|>")
        if end < 0:
            return text
        return None if "<|tool|>" in text[end:] else text[:end]

    def token_bytes(self, token_id: int, skip_special_tokens: bool = True) -> bytes:
        """The UTF-8 bytes one token stands for: a byte-fallback token's one
        byte (maybe part of a character), a piece's text, a special token's
        name unless skipped. Raises ValueError outside the vocabulary."""
        if not 0 <= token_id < VOCAB_SIZE:
            raise ValueError(f"token id {token_id} is outside the vocabulary of {VOCAB_SIZE}")
        if token_id < BYTE_OFFSET:
            return b"" if skip_special_tokens else SPECIAL_TOKENS[token_id].encode()
        if token_id < PIECE_OFFSET:
            return bytes([token_id - BYTE_OFFSET])
        return PIECES[token_id - PIECE_OFFSET].encode()

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
