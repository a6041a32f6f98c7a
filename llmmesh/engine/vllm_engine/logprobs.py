"""vLLM's sample logprobs as :class:`engine.backend.TokenLogprobs`.

vLLM returns, per output token, a dict of token id to ``Logprob`` holding
the sampled token and the ``top_logprobs`` likeliest ones (each with its
rank; the sampled token may rank below them). Its values are vLLM's
default ``raw_logprobs``: the model's distribution before penalties,
logit bias, temperature or a grammar's mask, as vLLM's own OpenAI server
reports them.

A token's bytes come from the tokenizer's vocabulary, not from decoding:
a byte-level BPE piece or a byte-fallback piece may hold part of a UTF-8
character, which decoded text would replace with U+FFFD. The token's text
is its bytes decoded with replacement, so the two always agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

from llmmesh.engine.backend import TokenLogprobs, TopLogprob

# vLLM always reports the sampled token; should a position lack it, the
# token gets OpenAI's value for "too unlikely to say" rather than -inf,
# which JSON cannot carry.
UNKNOWN_LOGPROB = -9999.0


class _Logprob(Protocol):
    logprob: float
    rank: int | None


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed: the
    alphabet byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def _decoder_kind(tokenizer: Any) -> str:
    """``byte_level``, ``byte_fallback`` or ``raw``: how the vocabulary's
    strings map to bytes, read from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "raw"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {step.get("type") for step in decoder.get("decoders", [])}
    if "ByteLevel" in kinds:
        return "byte_level"
    if "ByteFallback" in kinds:
        return "byte_fallback"
    return "raw"


class TokenBytes:
    """Each token id's bytes and text for one tokenizer, computed once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._kind = _decoder_kind(tokenizer)
        self._special = set(getattr(tokenizer, "all_special_ids", ()))
        self._cache: dict[int, tuple[str, bytes]] = {}
        self._control: dict[bytes, tuple[int, ...]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        """The token's text and its bytes."""
        cached = self._cache.get(token_id)
        if cached is None:
            data = self._bytes(token_id)
            cached = (data.decode("utf-8", errors="replace"), data)
            self._cache[token_id] = cached
        return cached

    def control_tokens(self, vocab_size: int, allowed: bytes = b"") -> tuple[int, ...]:
        """The ordinary tokens of ids below ``vocab_size`` whose bytes hold a
        control character (below 0x20) other than those in ``allowed``;
        computed once per ``allowed``."""
        cached = self._control.get(allowed)
        if cached is None:
            banned = set(range(0x20)) - set(allowed)
            cached = tuple(
                token_id
                for token_id in range(min(vocab_size, len(self._tokenizer)))
                if token_id not in self._special and banned.intersection(self(token_id)[1])
            )
            self._control[allowed] = cached
        return cached

    def _bytes(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return bytes(self._tokenizer.decode([token_id]), "utf-8")
        if token_id in self._special:
            return piece.encode()
        if self._kind == "byte_level":
            alphabet = _byte_level_alphabet()
            if all(char in alphabet for char in piece):
                return bytes(alphabet[char] for char in piece)
            return piece.encode()  # an added token written in plain text
        if self._kind == "byte_fallback":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode()
        return piece.encode()


def token_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[Mapping[int, _Logprob] | None],
    top: int,
    texts: TokenBytes,
) -> tuple[TokenLogprobs, ...]:
    """One :class:`TokenLogprobs` per output token, with its ``top``
    likeliest alternatives by vLLM's rank."""
    entries: list[TokenLogprobs] = []
    for token_id, position in zip(token_ids, positions, strict=True):
        position = position or {}
        own = position.get(token_id)
        ranked = sorted(position.items(), key=lambda item: item[1].rank or 0)[:top]
        text, data = texts(token_id)
        entries.append(
            TokenLogprobs(
                token_id=token_id,
                token=text,
                logprob=own.logprob if own is not None else UNKNOWN_LOGPROB,
                token_bytes=data,
                top=tuple(_top(texts, tid, lp.logprob) for tid, lp in ranked),
            )
        )
    return tuple(entries)


def _top(texts: TokenBytes, token_id: int, logprob: float) -> TopLogprob:
    text, data = texts(token_id)
    return TopLogprob(token_id=token_id, token=text, logprob=logprob, token_bytes=data)
