"""``llmmesh-tiny-embed``: the small embedding model the project builds
itself, offline and deterministically, as :mod:`engine.tiny_model` builds
the chat model (``llmmesh model build-tiny-embed``).

It is a two-layer Llama-architecture transformer with seeded random
weights over the chat model's own byte-level BPE tokenizer, saved in the
Hugging Face layout. vLLM serves it as an embedding model by converting
the causal LM into a pooling one (``runner="pooling"``,
``convert="embed"``): the mean of the last hidden states, L2-normalised, so
a vector has ``hidden_size`` (256) components. With random weights the
vectors carry no meaning, but the serving path (tokenizer, batching,
pooling, normalisation) is vLLM's own, exactly as for a trained model.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmmesh.core.home import mesh_home
from llmmesh.engine.tiny_model import TinyModelSpec, build_hf_tokenizer, llama_config, readable_by_all

EMBED_MODEL_NAME = "llmmesh-tiny-embed"
EMBED_SEED = 20261124
EMBED_MARKER_FILE = "llmmesh-tiny-embed.json"
EMBED_SPEC = TinyModelSpec(num_layers=2, context_window=2048)
"""The shape: the chat model's tokenizer and width, half its depth and window."""


def build_tiny_embedding_model(out_dir: Path, spec: TinyModelSpec = EMBED_SPEC) -> Path:
    """Write the embedding model and its tokenizer into ``out_dir`` (created
    if missing) and return it. Takes a few seconds."""
    import torch
    from transformers import LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = build_hf_tokenizer(spec)
    # Tied: an embedding model never uses the output head, so it costs no weights.
    config = llama_config(spec, hf_tokenizer, tie_word_embeddings=True)
    torch.manual_seed(EMBED_SEED)
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir)
    hf_tokenizer.save_pretrained(out_dir)
    marker = {"name": EMBED_MODEL_NAME, "seed": EMBED_SEED, "spec": spec.__dict__, "pooling": "mean"}
    (out_dir / EMBED_MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    readable_by_all(out_dir)
    return out_dir


def is_tiny_embedding_model(path: Path) -> bool:
    """Whether ``path`` holds a complete build of this module."""
    return all((path / name).is_file() for name in (EMBED_MARKER_FILE, "config.json", "tokenizer.json"))


def resolve_embedding_model_dir(configured: str) -> Path:
    """The embedding model a vLLM pod serves: ``configured`` when set (it
    must hold a Hugging Face model), else ``$LLMMESH_HOME/models/
    llmmesh-tiny-embed``, built on first use. ValueError for a directory
    without a model."""
    if configured:
        path = Path(configured).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"no model in {path}: config.json is missing")
        return path
    path = mesh_home() / "models" / EMBED_MODEL_NAME
    if not is_tiny_embedding_model(path):
        build_tiny_embedding_model(path)
    return path
