"""Tokenizers as data: what an engine pod publishes (``EngineService.GetTokenizer``)
so that a region can tokenize chat prompts itself, exactly as the pod would.

Two kinds, one per engine backend:

- :class:`PieceTokenizerSpec`: a word-piece vocabulary with byte fallback and
  role-marker chat rendering, the simulator's tokenizer. :class:`PieceTokenizer`
  runs it, for the simulator pod and for the region alike, so the two cannot
  drift apart.
- :class:`HfTokenizerSpec`: a Hugging Face ``tokenizer.json`` with a Jinja chat
  template, vLLM's; the region runs it with ``tokenizers`` and ``jinja2``.

Also :func:`chat_role_name`, the role names chat templates use.
"""

from __future__ import annotations

import re
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmmesh.v1 import common_pb2, engine_service_pb2

_ROLE_PREFIX = "CHAT_ROLE_"

CACHED_CONTENT_CHARS = 512
"""The shortest message content whose ids :class:`PieceTokenizer` keeps (a
shorter one encodes in about as long as the cache takes)."""
CACHED_CONTENT_MAX_CHARS = 16_384
"""The longest it keeps: a document-sized message is rarely sent twice."""
CONTENT_CACHE_ENTRIES = 128
"""How many message contents' ids it keeps, the least recently used going
first: at most 2 M characters, and their ids at 4 bytes an id (an id per
character of ASCII text, at most one per UTF-8 byte of any)."""


def chat_role_name(role: common_pb2.ChatRole.ValueType) -> str:
    """A chat role as chat templates name it ("system", "user", "assistant", ...);
    an unspecified role is ``"unspecified"``, which no template accepts."""
    return common_pb2.ChatRole.Name(role).removeprefix(_ROLE_PREFIX).lower()


@dataclass(frozen=True)
class PieceTokenizerSpec:
    """A word-piece tokenizer with byte fallback; see :class:`PieceTokenizer`."""

    pieces: tuple[str, ...]
    """The vocabulary pieces; piece ``i`` has id ``piece_offset + i``."""
    piece_offset: int
    byte_offset: int
    """The id of byte 0x00; byte ``b`` has id ``byte_offset + b``."""
    pattern: str
    """The pre-tokenization regular expression; its matches must partition any text."""
    bos_id: int
    end_of_turn_id: int
    role_ids: Mapping[str, int]
    """The id that opens a chat message, by role name."""


@dataclass(frozen=True)
class HfTokenizerSpec:
    """A Hugging Face tokenizer and its chat template, as transformers' ``apply_chat_template`` runs them."""

    tokenizer_json: str
    chat_template: str
    template_variables: Mapping[str, str]
    """What the template may read besides ``messages`` and ``add_generation_prompt``: the special tokens."""


TokenizerSpec = PieceTokenizerSpec | HfTokenizerSpec


class PieceTokenizer:
    """Runs a :class:`PieceTokenizerSpec`. Cheap to call; what it keeps
    between calls is a cache of its own answers.

    Text is split into the matches of the pattern; a match that is a piece
    becomes its id, any other match one id per UTF-8 byte (SentencePiece's
    byte fallback), so every text has stable ids. A lone surrogate, which is
    not valid UTF-8, encodes as ``?``.

    A chat's messages are encoded one by one (:meth:`render_chat`), so a
    message many prompts share (a tenant's system prompt, a conversation's
    earlier turns) encodes to the same ids each time: the ids of the last
    :data:`CONTENT_CACHE_ENTRIES` messages of :data:`CACHED_CONTENT_CHARS`
    characters or more (up to :data:`CACHED_CONTENT_MAX_CHARS`) are kept and
    reused. Encoding is a function of the text alone, so the reuse changes
    no id.
    """

    def __init__(self, spec: PieceTokenizerSpec) -> None:
        self.spec = spec
        self._pattern = re.compile(spec.pattern)
        self._piece_ids = {piece: spec.piece_offset + index for index, piece in enumerate(spec.pieces)}
        self._byte_offset = spec.byte_offset
        self._role_ids = dict(spec.role_ids)
        self._contents: OrderedDict[str, array[int]] = OrderedDict()

    def piece_id(self, piece: str) -> int:
        """The id of one vocabulary piece; KeyError if it is not one."""
        return self._piece_ids[piece]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        ids: list[int] = []
        piece_ids, byte_offset = self._piece_ids, self._byte_offset
        for match in self._pattern.finditer(text):
            piece = match.group()
            known = piece_ids.get(piece)
            if known is not None:
                ids.append(known)
            else:
                ids.extend(byte_offset + byte for byte in piece.encode("utf-8", errors="replace"))
        return ids

    def render_chat(self, turns: Iterable[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        """Chat turns ``(role, content)`` as BOS, then per turn its role's id,
        its content and the end-of-turn id, then (when asked) the assistant
        role's id. Raises ValueError for a role without an id."""
        ids = [self.spec.bos_id]
        for role, content in turns:
            role_id = self._role_ids.get(role)
            if role_id is None:
                raise ValueError(f"unknown chat role {role!r}; expected one of {', '.join(self._role_ids)}")
            ids.append(role_id)
            ids.extend(self._content_ids(content))
            ids.append(self.spec.end_of_turn_id)
        if add_generation_prompt:
            opener = self._role_ids.get("assistant")
            if opener is None:
                raise ValueError("the vocabulary has no assistant role to open a reply with")
            ids.append(opener)
        return ids

    def _content_ids(self, content: str) -> Sequence[int]:
        """:meth:`encode` of one message's content, from the cache where it is kept."""
        if not CACHED_CONTENT_CHARS <= len(content) <= CACHED_CONTENT_MAX_CHARS:
            return self.encode(content)
        cache = self._contents
        ids = cache.get(content)
        if ids is not None:
            cache.move_to_end(content)
            return ids
        ids = cache[content] = array("i", self.encode(content))
        if len(cache) > CONTENT_CACHE_ENTRIES:
            cache.popitem(last=False)
        return ids


def tokenizer_response(model: str, spec: TokenizerSpec | None) -> engine_service_pb2.GetTokenizerResponse:
    """The ``GetTokenizer`` answer describing ``spec`` (none set when ``spec`` is None)."""
    response = engine_service_pb2.GetTokenizerResponse(model=model)
    if isinstance(spec, PieceTokenizerSpec):
        response.pieces.CopyFrom(
            engine_service_pb2.PieceTokenizer(
                pieces=spec.pieces,
                piece_offset=spec.piece_offset,
                byte_offset=spec.byte_offset,
                pattern=spec.pattern,
                bos_id=spec.bos_id,
                end_of_turn_id=spec.end_of_turn_id,
                role_ids=dict(spec.role_ids),
            )
        )
    elif isinstance(spec, HfTokenizerSpec):
        response.hf.CopyFrom(
            engine_service_pb2.HfTokenizer(
                tokenizer_json=spec.tokenizer_json,
                chat_template=spec.chat_template,
                template_variables=dict(spec.template_variables),
            )
        )
    return response


def tokenizer_spec(response: engine_service_pb2.GetTokenizerResponse) -> TokenizerSpec | None:
    """The tokenizer a ``GetTokenizer`` answer describes, or None when it describes none."""
    kind = response.WhichOneof("tokenizer")
    if kind == "pieces":
        pieces = response.pieces
        return PieceTokenizerSpec(
            pieces=tuple(pieces.pieces),
            piece_offset=pieces.piece_offset,
            byte_offset=pieces.byte_offset,
            pattern=pieces.pattern,
            bos_id=pieces.bos_id,
            end_of_turn_id=pieces.end_of_turn_id,
            role_ids=dict(pieces.role_ids),
        )
    if kind == "hf":
        hf = response.hf
        return HfTokenizerSpec(hf.tokenizer_json, hf.chat_template, dict(hf.template_variables))
    return None
