"""When an embeddings request may carry token ids instead of text.

OpenAI's embeddings API takes token ids, and clients send them unasked:
LangChain's ``OpenAIEmbeddings`` tokenizes text with tiktoken's
``cl100k_base`` and sends those ids. A mesh model's vocabulary is not
tiktoken's, and ids below its vocabulary size would embed as unrelated
tokens without any error, so token ids are taken only when the request
states whose they are: the ``x-llmmesh-token-ids`` header (gRPC metadata
at the region) naming the embedding model, declaring they are that model's
own tokenizer's ids. The pod still refuses an id outside its vocabulary.
"""

from __future__ import annotations

TOKEN_IDS_HEADER = "x-llmmesh-token-ids"
"""The header (and gRPC metadata key) naming the model whose tokenizer made the ids."""


def token_ids_refusal(models: tuple[str, ...], declared: str | None, has_token_ids: bool) -> str | None:
    """Why a request for the model known as ``models`` (its requested and
    resolved names) may not be embedded, or None when it may: it holds token
    ids (``has_token_ids``) without a declaration naming one of ``models``,
    or it declares another model's ids."""
    if declared is not None and declared not in models:
        return (
            f"{TOKEN_IDS_HEADER} names model {declared!r}, but the request embeds with {models[0]!r}: "
            "token ids are embedded only as the requested model's own"
        )
    if has_token_ids and declared is None:
        return (
            f"input holds token ids, which would embed as {models[0]}'s own tokens (a tiktoken id is "
            f"not one): send the text instead (LangChain's OpenAIEmbeddings: "
            f"check_embedding_ctx_length=False), or set the header '{TOKEN_IDS_HEADER}: {models[0]}' "
            f"to state these are {models[0]}'s token ids"
        )
    return None
