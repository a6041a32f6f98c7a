"""Speculative decoding in ``llmmesh bench engine``: the pod flags that pin
it on or off, and vLLM's counters of draft and accepted tokens read from a
pod's /metrics."""

from __future__ import annotations

import urllib.request

from llmmesh.engine.vllm_engine.config import VllmEngineConfig

SPEC_COUNTERS = {
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}


def speculative_flags(config: VllmEngineConfig) -> list[str]:
    """The pod flags of ``config``'s speculative decoding, or none to turn
    it off whatever ``LLMMESH_SPECULATIVE_METHOD`` says."""
    spec = config.speculative
    if spec is None:
        return ["--speculative-method", ""]
    flags = [
        "--speculative-method",
        spec["method"],
        "--num-speculative-tokens",
        str(spec["num_speculative_tokens"]),
    ]
    if spec["method"] == "ngram":
        flags += [
            "--prompt-lookup-max",
            str(spec["prompt_lookup_max"]),
            "--prompt-lookup-min",
            str(spec["prompt_lookup_min"]),
        ]
    return flags


def read_counters(metrics_url: str, names: dict[str, str]) -> dict[str, float]:
    """Prometheus counters from a pod's /metrics, summed over their labels."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for key, metric in names.items():
            if line.startswith((metric + "{", metric + " ")):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals
