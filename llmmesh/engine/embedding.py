"""A pod's embedding model: the boundary :class:`EmbeddingBackend` (the
simulator's hashed n-gram model, :mod:`engine.embedding_sim`, or vLLM
pooling, :mod:`engine.embedding_vllm`) and :class:`Embedder`, which checks
a batch, tokenizes its texts, runs the backend and shapes the vectors.

Contract of every backend: a vector is a deterministic function of the
input's token ids (the same ids give the same vector on any pod of the
same model), L2-normalised. ``dimensions`` keeps a vector's leading
components and normalises them again (as OpenAI's ``text-embedding-3``
models do); asking for more than the model has is refused, never padded.
Errors are :class:`llmmesh.core.errors.MeshError`, ``param`` naming the field
(``model``, ``input``, ``dimensions``) as the edge reports it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from llmmesh.core.config import setting
from llmmesh.core.errors import InvalidArgument, NotFound, Reason

EMBEDDING_BACKENDS = ("sim", "vllm", "none")

MAX_BATCH_INPUTS = 2048
"""Most inputs in one batch, OpenAI's own limit for ``/v1/embeddings``."""


@dataclass(frozen=True)
class EmbeddingSettings:
    """The embedding fields of a pod's settings (:class:`engine.settings.EngineSettings`)."""

    embedding_backend: str = setting(
        "",
        "embedding model runner: 'sim' (hashed token n-grams), 'vllm' (vLLM pooling), 'none'; "
        "empty: 'sim' on a simulator pod, 'none' on a vLLM pod (a second vLLM engine costs memory)",
    )
    embedding_model: str = setting("llmmesh-tiny-embed", "name of the embedding model this pod serves")
    embedding_dimensions: int = setting(256, "simulator: components of a full embedding vector")
    embedding_max_input_tokens: int = setting(2048, "most tokens one embedding input may have")
    embedding_model_path: str = setting(
        "",
        "vllm embeddings: Hugging Face model directory; empty builds llmmesh-tiny-embed "
        "in $LLMMESH_HOME/models",
    )

    def embedding_runner(self, backend: str) -> str:
        """The embedding runner of a pod whose generation backend is ``backend``."""
        chosen = self.embedding_backend or ("sim" if backend == "sim" else "none")
        if chosen not in EMBEDDING_BACKENDS:
            raise ValueError(f"embedding_backend must be one of {EMBEDDING_BACKENDS}, got {chosen!r}")
        return chosen


@dataclass(frozen=True)
class EmbeddingModelInfo:
    """What a backend embeds with."""

    model: str
    backend: str
    dimensions: int
    max_input_tokens: int
    vocab_size: int
    max_batch_inputs: int = MAX_BATCH_INPUTS


@dataclass(frozen=True)
class EmbeddedInput:
    """One input's vector and the tokens it took."""

    vector: tuple[float, ...]
    input_tokens: int


TextOrTokens = str | tuple[int, ...]
"""One input: a text, or token ids of the model's tokenizer."""


class EmbeddingBackend(ABC):
    """Runs an embedding model. :meth:`start` first, :meth:`close` once at the end."""

    @abstractmethod
    def info(self) -> EmbeddingModelInfo:
        """The model's name and shape."""

    @abstractmethod
    async def start(self) -> None:
        """Load the model."""

    @abstractmethod
    async def close(self) -> None:
        """Release the model."""

    @abstractmethod
    async def tokenize(self, text: str) -> tuple[int, ...]:
        """The ids the model embeds for ``text``, special tokens included."""

    @abstractmethod
    async def embed(self, batch: Sequence[tuple[int, ...]]) -> list[list[float]]:
        """One full-width, L2-normalised vector per input of token ids."""


def normalised(vector: Sequence[float], dimensions: int | None = None) -> tuple[float, ...]:
    """``vector``'s first ``dimensions`` components (all when None) scaled to
    unit length; a zero vector stays zero."""
    kept = vector[:dimensions] if dimensions is not None else vector
    norm = math.sqrt(math.fsum(x * x for x in kept))
    if norm == 0.0:
        return tuple(0.0 for _ in kept)
    return tuple(x / norm for x in kept)


class Embedder:
    """Embeds batches for one pod: validation, tokenization, the backend."""

    def __init__(self, backend: EmbeddingBackend) -> None:
        self.backend = backend

    def info(self) -> EmbeddingModelInfo:
        return self.backend.info()

    async def embed(
        self, model: str, inputs: Sequence[TextOrTokens], dimensions: int | None = None
    ) -> list[EmbeddedInput]:
        """One :class:`EmbeddedInput` per input, in order. NOT_FOUND for
        another model; INVALID_ARGUMENT for an empty batch or input, a batch
        over ``max_batch_inputs``, an input over ``max_input_tokens``, a
        token id outside the vocabulary, or ``dimensions`` outside
        ``1..dimensions``."""
        info = self.backend.info()
        if model and model != info.model:
            raise NotFound(
                Reason.UNKNOWN_MODEL,
                f"this pod embeds with {info.model!r}, not {model!r}",
                metadata={"param": "model"},
            )
        require_batch(len(inputs), info.max_batch_inputs)
        if dimensions is not None and not 1 <= dimensions <= info.dimensions:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"dimensions must be between 1 and {info.dimensions} for model {info.model}, "
                f"got {dimensions}",
                metadata={"param": "dimensions"},
            )
        batch: list[tuple[int, ...]] = []
        for index, item in enumerate(inputs):
            ids = await self.backend.tokenize(item) if isinstance(item, str) else item
            require_input(index, item, ids, info)
            batch.append(ids)
        vectors = await self.backend.embed(batch)
        return [
            EmbeddedInput(normalised(vector, dimensions), len(ids))
            for vector, ids in zip(vectors, batch, strict=True)
        ]


def require_batch(count: int, most: int) -> None:
    """INVALID_ARGUMENT (param ``input``) unless ``1 <= count <= most``."""
    if count == 0:
        raise InvalidArgument(
            Reason.EMPTY_PROMPT, "input must hold at least one item", metadata={"param": "input"}
        )
    if count > most:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            f"input holds {count} items; at most {most} are embedded in one request",
            metadata={"param": "input"},
        )


def require_input(index: int, item: TextOrTokens, ids: Sequence[int], info: EmbeddingModelInfo) -> None:
    """INVALID_ARGUMENT (param ``input``) for an empty input, one over the
    model's token limit, or a token id outside its vocabulary."""
    where = f"input[{index}]"
    if not item:
        raise InvalidArgument(
            Reason.EMPTY_PROMPT,
            f"{where} is empty; every input needs text or tokens",
            metadata={"param": "input"},
        )
    if len(ids) > info.max_input_tokens:
        raise InvalidArgument(
            Reason.PROMPT_TOO_LONG,
            f"{where} has {len(ids)} tokens; model {info.model} embeds at most {info.max_input_tokens}",
            metadata={"param": "input"},
        )
    for token in ids:
        if not 0 <= token < info.vocab_size:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"{where} holds token id {token}, outside the vocabulary of {info.vocab_size}",
                metadata={"param": "input"},
            )
