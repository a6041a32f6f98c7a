"""Input and streaming output safety filters for chat turns.

Build them with :func:`build_filters`; the gateway runs
:meth:`InputFilter.check` before any engine work and feeds each reply's
deltas through a fresh :class:`StreamingOutputFilter`. Every failure of a
safety backend fails closed (``Unavailable(SAFETY_UNAVAILABLE)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmesh.region.safety.backend import SafetyBackend
from llmmesh.region.safety.config import (
    SafetySettings,
    SafetyValues,
    parse_categories,
    parse_term_lists,
)
from llmmesh.region.safety.filters import InputFilter, OutputDecision, StreamingOutputFilter, screen
from llmmesh.region.safety.judge import (
    DEFAULT_POLICY,
    CompleteFn,
    JudgeAnswerError,
    LlmJudgeBackend,
    parse_judgement,
)
from llmmesh.region.safety.rules import RulesBackend, contains_card_number, luhn_valid
from llmmesh.region.safety.verdict import (
    ALL_CATEGORIES,
    EXTENSION_CATEGORIES,
    OPENAI_CATEGORIES,
    CheckKind,
    Verdict,
)

__all__ = [
    "ALL_CATEGORIES",
    "DEFAULT_POLICY",
    "EXTENSION_CATEGORIES",
    "OPENAI_CATEGORIES",
    "CheckKind",
    "CompleteFn",
    "InputFilter",
    "JudgeAnswerError",
    "LlmJudgeBackend",
    "OutputDecision",
    "RulesBackend",
    "SafetyBackend",
    "SafetyFilters",
    "SafetySettings",
    "SafetyValues",
    "StreamingOutputFilter",
    "Verdict",
    "build_filters",
    "contains_card_number",
    "luhn_valid",
    "parse_judgement",
    "screen",
]

_ALIASES = {"both": ("rules", "judge"), "none": ()}


@dataclass(frozen=True)
class SafetyFilters:
    """The input filter, shared by all turns, and a factory of output filters,
    one per turn."""

    input_filter: InputFilter
    backends: tuple[SafetyBackend, ...]
    window_chars: int
    overlap_chars: int
    min_check_chars: int
    timeout_s: float
    retry_after_s: float

    def new_output_filter(self) -> StreamingOutputFilter:
        return StreamingOutputFilter(
            self.backends,
            self.window_chars,
            self.overlap_chars,
            min_check_chars=self.min_check_chars,
            timeout_s=self.timeout_s,
            retry_after_s=self.retry_after_s,
        )


def _backend_names(raw: str) -> tuple[str, ...]:
    names: list[str] = []
    for token in (part.strip().lower() for part in raw.split(",")):
        if not token:
            continue
        for name in _ALIASES.get(token, (token,)):
            if name not in ("rules", "judge"):
                raise ValueError(f"unknown safety backend {name!r}; use rules, judge, both or none")
            if name not in names:
                names.append(name)
    return tuple(names)


def build_filters(
    values: SafetyValues, *, judge: CompleteFn | None = None, judge_policy: str = DEFAULT_POLICY
) -> SafetyFilters:
    """Filters with the backends ``values.safety_backends`` names, in that
    order (put ``rules`` first: it is cheap and a flag skips the judge).

    ``judge`` is the model call the ``judge`` backend uses; naming ``judge``
    without one is a ValueError. With a judge, output is checked only in
    full windows, since every check is a model call.
    """
    report_only = parse_categories(values.safety_report_only)
    backends: list[SafetyBackend] = []
    for name in _backend_names(values.safety_backends):
        if name == "rules":
            terms = parse_term_lists(values.safety_deny_terms)
            backends.append(
                RulesBackend(
                    deny_terms=terms, report_only=report_only, hold_first_word=values.safety_hold_first_word
                )
            )
        else:
            if judge is None:
                raise ValueError("the judge safety backend needs a model to call")
            backends.append(LlmJudgeBackend(judge, judge_policy, report_only=report_only))
    window, overlap = values.safety_window_chars, values.safety_overlap_chars
    uses_judge = any(isinstance(b, LlmJudgeBackend) for b in backends)
    filters = SafetyFilters(
        input_filter=InputFilter(
            backends, timeout_s=values.safety_timeout_s, retry_after_s=values.safety_retry_after_s
        ),
        backends=tuple(backends),
        window_chars=window,
        overlap_chars=overlap,
        min_check_chars=window - overlap if uses_judge else 1,
        timeout_s=values.safety_timeout_s,
        retry_after_s=values.safety_retry_after_s,
    )
    filters.new_output_filter()  # validates window and overlap now, not on the first turn
    return filters
