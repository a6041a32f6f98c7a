"""vLLM pooling behind :class:`engine.embedding.EmbeddingBackend`.

A second ``AsyncLLM`` beside the pod's generation engine, in pooling mode:
``runner="pooling"`` with ``convert="embed"`` turns the causal LM
(``llmmesh-tiny-embed`` by default, :mod:`engine.embedding_model`) into an
embedding model whose pooler takes the mean of the last hidden states and
L2-normalises it. Inputs go in as token ids (the region's texts are
tokenized here with the model's tokenizer first), one vLLM request each,
batched by vLLM's scheduler. Prefix caching is off: a pooling request
reads its whole prompt once.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Sequence
from typing import Any

from vllm import PoolingParams
from vllm.config.pooler import PoolerConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.v1.engine.async_llm import AsyncLLM

from llmmesh.core.errors import Reason, Unavailable
from llmmesh.engine.embedding import EmbeddingBackend, EmbeddingModelInfo, EmbeddingSettings
from llmmesh.engine.embedding_model import resolve_embedding_model_dir


class VllmEmbeddingBackend(EmbeddingBackend):
    """An embedding model served by vLLM's pooling runner."""

    def __init__(self, settings: EmbeddingSettings, dtype: str = "float32", kv_cache_gib: int = 1) -> None:
        self._settings = settings
        self._dtype = dtype
        self._kv_cache_gib = kv_cache_gib
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._info: EmbeddingModelInfo | None = None

    def engine_args(self) -> AsyncEngineArgs:
        """The pooling engine's arguments."""
        model_dir = resolve_embedding_model_dir(self._settings.embedding_model_path)
        return AsyncEngineArgs(
            model=str(model_dir),
            served_model_name=[self._settings.embedding_model],
            runner="pooling",
            convert="embed",
            pooler_config=PoolerConfig(seq_pooling_type="MEAN", use_activation=True),
            max_model_len=self._settings.embedding_max_input_tokens,
            dtype=self._dtype,
            enable_prefix_caching=False,
            enforce_eager=True,
        )

    async def start(self) -> None:
        if self._llm is not None:
            return
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self._kv_cache_gib))
        self._llm = AsyncLLM.from_engine_args(self.engine_args())
        self._tokenizer = self._llm.get_tokenizer()
        model_config = self._llm.vllm_config.model_config
        self._info = EmbeddingModelInfo(
            model=self._settings.embedding_model,
            backend="vllm",
            dimensions=model_config.get_hidden_size(),
            max_input_tokens=model_config.max_model_len,
            vocab_size=model_config.get_vocab_size(),
        )

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def info(self) -> EmbeddingModelInfo:
        if self._info is None:
            raise RuntimeError("the vLLM embedding engine is not started")
        return self._info

    async def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text))

    async def embed(self, batch: Sequence[tuple[int, ...]]) -> list[list[float]]:
        llm = self._llm
        if llm is None:
            raise Unavailable(
                Reason.ENGINE_UNAVAILABLE, "the embedding engine is not running", retry_after_s=1.0
            )

        async def one(ids: tuple[int, ...]) -> list[float]:
            final = None
            async for output in llm.encode(
                TokensPrompt(prompt_token_ids=list(ids)),
                PoolingParams(task="embed"),
                request_id=f"emb-{secrets.token_hex(8)}",
            ):
                final = output
            if final is None:
                raise Unavailable(Reason.ENGINE_FAILED, "vLLM returned no embedding", retry_after_s=1.0)
            values: list[float] = final.outputs.data.float().tolist()
            return values

        return list(await asyncio.gather(*(one(ids) for ids in batch)))
