"""``llmmesh model build-tiny``: build the small Llama-architecture model
vLLM-CPU serves (:mod:`engine.tiny_model`); ``build-tiny-embed``: its
embedding sibling, served by vLLM pooling (:mod:`engine.embedding_model`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="model_action", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build-tiny",
        help="build llmmesh-tiny (Llama, BPE tokenizer, chat template) offline and deterministically",
    )
    build.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    embed = actions.add_parser(
        "build-tiny-embed",
        help="build llmmesh-tiny-embed (Llama, mean-pooled by vLLM pooling) offline and deterministically",
    )
    embed.add_argument("--out", required=True, type=Path, help="directory to write the model into")


def run_model(args: argparse.Namespace) -> int:
    try:
        from engine.embedding_model import EMBED_MODEL_NAME, build_tiny_embedding_model
        from engine.tiny_model import MODEL_NAME, build_tiny_model
    except ImportError as exc:  # pragma: no cover - exercised only without the vllm extra
        print(f"llmmesh model: building needs torch and transformers ({exc})", file=sys.stderr)
        return 1
    out: Path = args.out
    if out.exists() and not out.is_dir():
        print(f"llmmesh model: {out} exists and is not a directory", file=sys.stderr)
        return 2
    embedding = args.model_action == "build-tiny-embed"
    print(f"building {EMBED_MODEL_NAME if embedding else MODEL_NAME} in {out} …", file=sys.stderr)
    started = time.monotonic()
    try:
        if embedding:
            build_tiny_embedding_model(out)
        else:
            build_tiny_model(out)
    except OSError as exc:
        print(f"llmmesh model: {exc}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in out.iterdir() if path.is_file())
    print(
        json.dumps(
            {"model": str(out), "bytes": size, "seconds": round(time.monotonic() - started, 2)},
        )
    )
    return 0
