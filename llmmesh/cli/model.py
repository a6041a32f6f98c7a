"""``llmmesh model build-tiny``: build the small Llama-architecture model
vLLM-CPU serves (:mod:`engine.tiny_model`); ``build --name NAME``: any
member of the model family (:mod:`llmmesh.core.model_family`: tiny, small,
large, one tokenizer); ``build-tiny-embed``: the embedding sibling, served
by vLLM pooling (:mod:`engine.embedding_model`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmmesh.core.model_family import FAMILY


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="model_action", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build-tiny",
        help="build llmmesh-tiny (Llama, BPE tokenizer, chat template) offline and deterministically",
    )
    build.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    member = actions.add_parser(
        "build",
        help="build one model of the family (llmmesh-tiny, llmmesh-small, llmmesh-large; one tokenizer)",
    )
    member.add_argument("--name", required=True, choices=sorted(FAMILY), help="the family member")
    member.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    embed = actions.add_parser(
        "build-tiny-embed",
        help="build llmmesh-tiny-embed (Llama, mean-pooled by vLLM pooling) offline and deterministically",
    )
    embed.add_argument("--out", required=True, type=Path, help="directory to write the model into")


def run_model(args: argparse.Namespace) -> int:
    try:
        from llmmesh.engine.embedding_model import EMBED_MODEL_NAME, build_tiny_embedding_model
        from llmmesh.engine.tiny_model import MODEL_NAME, build_tiny_model, family_spec
    except ImportError as exc:  # pragma: no cover - exercised only without the vllm extra
        print(f"llmmesh model: building needs torch and transformers ({exc})", file=sys.stderr)
        return 1
    out: Path = args.out
    if out.exists() and not out.is_dir():
        print(f"llmmesh model: {out} exists and is not a directory", file=sys.stderr)
        return 2
    embedding = args.model_action == "build-tiny-embed"
    name = args.name if args.model_action == "build" else MODEL_NAME
    print(f"building {EMBED_MODEL_NAME if embedding else name} in {out} …", file=sys.stderr)
    started = time.monotonic()
    try:
        if embedding:
            build_tiny_embedding_model(out)
        else:
            build_tiny_model(out, family_spec(name), name)
    except OSError as exc:
        print(f"llmmesh model: {exc}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in out.iterdir() if path.is_file())
    print(
        json.dumps(
            {
                "model": str(out),
                "name": EMBED_MODEL_NAME if embedding else name,
                "bytes": size,
                "seconds": round(time.monotonic() - started, 2),
            },
        )
    )
    return 0
