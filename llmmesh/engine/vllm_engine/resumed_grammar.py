"""Guided decoding that resumes mid-output, for continuations.

vLLM starts a request's grammar at its first output token. A continuation
after failover puts the output already streamed into the prompt
(``resume_output_token_ids``), so vLLM's own structured outputs would start
the JSON afresh after half of it. This logits processor instead feeds the
resumed tokens to an xgrammar matcher first and masks each later step with
what the grammar still allows, so the continued tool calls or JSON reply
stay one valid document.

It compiles the same grammar vLLM's xgrammar backend would for the request
(:func:`engine.vllm_engine.sampling.guided_grammar`: a JSON Schema with the
pod's whitespace setting, or a structural tag), so a resumed
reply follows the grammar the original one did. It runs in vLLM's engine
core, registered through ``logits_processors``; only requests whose
``SamplingParams.extra_args`` carry :data:`EXTRA_ARG` are touched, and a
batch without them costs one dict check per step. xgrammar is imported on
the first such request.

Resumed tokens the grammar rejects (a continuation of a reply made under
another grammar) cannot be continued validly: the request is then allowed
only its end-of-sequence token, and the pod fails the generation
(``INTERNAL``) when that leaves guided tool calls unfinished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

EXTRA_ARG = "llmmesh_resumed_grammar"
"""``extra_args`` key: ``{"kind", "grammar", "prefix": [token ids]}``, the
kind and text of :class:`engine.vllm_engine.sampling.Grammar`."""

QUALIFIED_NAME = f"{__name__}:ResumedGrammarLogitsProcessor"


def extra_args(kind: str, grammar: str, prefix: list[int]) -> dict[str, Any]:
    """``SamplingParams.extra_args`` that resume a grammar after ``prefix``."""
    return {EXTRA_ARG: {"kind": kind, "grammar": grammar, "prefix": list(prefix)}}


@dataclass
class _Row:
    """One resumed request: its matcher and how much of its output it has read."""

    matcher: Any
    output: list[int]  # vLLM's live list of the request's output tokens
    read: int = 0
    broken: bool = False

    def catch_up(self) -> None:
        while self.read < len(self.output) and not self.broken:
            if not self.matcher.accept_token(self.output[self.read]):
                self.broken = True
            self.read += 1


class ResumedGrammarLogitsProcessor(LogitsProcessor):  # type: ignore[misc]
    """Masks resumed guided requests with their grammar's next allowed tokens."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._config = vllm_config
        self._compiler: Any = None
        self._stop_ids: list[int] = []
        self._vocab_size = vllm_config.model_config.get_vocab_size()
        self._rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # the mask decides greedy picks too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, self._track)
        for row in self._rows.values():
            row.catch_up()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        import xgrammar as xgr

        indices = sorted(self._rows)
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self._vocab_size)
        for index in indices:
            row = self._rows[index]
            if row.broken:
                bitmask[index].zero_()
                for stop in self._stop_ids:
                    bitmask[index, stop // 32] |= 1 << (stop % 32)
            else:
                row.matcher.fill_next_token_bitmask(bitmask, index)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self._vocab_size, indices=indices)
        return logits

    def _track(self, params: Any, _prompt: list[int] | None, output: list[int]) -> _Row | None:
        spec = (params.extra_args or {}).get(EXTRA_ARG)
        if spec is None:
            return None
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self._compile(spec["kind"], spec["grammar"]))
        row = _Row(matcher, output)
        for token in spec["prefix"]:
            if not matcher.accept_token(token):
                log.error("resumed output does not follow its grammar; ending the request")
                row.broken = True
                break
        return row

    def _compile(self, kind: str, grammar: str) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(self._config.model_config)
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self._vocab_size)
            self._stop_ids = list(info.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        # As vLLM's xgrammar backend compiles each kind.
        if kind == "structural_tag":
            return self._compiler.compile_structural_tag(grammar)
        compact = self._config.structured_outputs_config.disable_any_whitespace
        return self._compiler.compile_json_schema(
            grammar, any_whitespace=not compact, separators=(",", ":") if compact else None
        )
