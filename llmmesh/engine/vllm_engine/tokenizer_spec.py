"""What a vLLM pod publishes of its tokenizer (``GetTokenizer``): the Hugging
Face ``tokenizer.json``, the chat template and the special tokens the
template may read, which is all transformers' ``apply_chat_template`` uses
to render and encode a chat (:meth:`engine.vllm_engine.backend.VllmBackend.tokenize`).

Kept apart from the backend so that it needs no vLLM: a transformers fast
tokenizer is all it reads.
"""

from __future__ import annotations

from typing import Any

from llmmesh.core.chat_tokenizer import HfTokenizerSpec


def hf_tokenizer_spec(tokenizer: Any) -> HfTokenizerSpec | None:
    """The spec of a transformers fast tokenizer, or None when data alone
    cannot reproduce it: no Rust backend tokenizer (a slow, Python one), no
    single chat template, or a special token that is not one string."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    if backend is None or not isinstance(template, str):
        return None
    variables = dict(tokenizer.special_tokens_map)
    if not all(isinstance(name, str) and isinstance(value, str) for name, value in variables.items()):
        return None
    return HfTokenizerSpec(backend.to_str(), template, variables)
