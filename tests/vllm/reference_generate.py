"""vLLM's own offline ``LLM.generate`` on the pod's engine arguments: the
reference the pod's greedy output must equal. Run as a process (vLLM spawns
its engine core), it prints the output token ids of each prompt as JSON.

Usage: python -m tests.vllm.reference_generate MODEL_DIR MAX_TOKENS PROMPTS_JSON
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(model_dir: str, max_tokens: int, prompts: list[list[int]]) -> list[list[int]]:
    from llmmesh.engine.settings import EngineSettings
    from llmmesh.engine.vllm_engine.config import VllmEngineConfig

    config = VllmEngineConfig.from_settings(EngineSettings(backend="vllm", max_num_seqs=2), Path(model_dir))
    for name, value in config.environment().items():
        os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams

    llm = LLM(**config.engine_kwargs())
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


if __name__ == "__main__":
    result = main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
    print(json.dumps(result))
