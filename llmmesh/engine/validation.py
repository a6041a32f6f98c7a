"""Checks every generation request passes before it reaches a backend.

Each failure is an ``InvalidArgument`` with an ErrorInfo reason and the
offending field as ``metadata["param"]``, so the edge can map it to
OpenAI's error object without parsing messages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.core.tool_calls import (
    FUNCTION_NAME_RULE,
    ChoiceMode,
    is_function_name,
    tool_choice_problem,
    tool_names_problem,
)
from llmmesh.engine.backend import (
    EngineInfo,
    GenerationRequest,
    KvTransferSpec,
    ResponseFormatSpec,
    ResponseFormatType,
    SamplingOptions,
    ToolChoiceMode,
    ToolChoiceSpec,
    ToolSpec,
)

PENALTY_RANGE = (-2.0, 2.0)
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_TOP_LOGPROBS = 20


def _invalid(reason: Reason, message: str, param: str) -> InvalidArgument:
    return InvalidArgument(reason, message, metadata={"param": param})


def validate_roles(roles: Sequence[int], known: Collection[int]) -> None:
    """Raise ``InvalidArgument`` unless every message's role is one of the
    ``known`` chat roles. The wire carries any number in an enum field; an
    unknown one (or none) must be refused here, not fail deeper down."""
    for i, role in enumerate(roles):
        if role not in known:
            raise _invalid(
                Reason.INVALID_REQUEST, f"messages[{i}].role {role} is not a chat role", "messages"
            )


def validate_generation(request: GenerationRequest, info: EngineInfo) -> None:
    """Raise ``InvalidArgument`` unless ``request`` can run on this pod."""
    if not request.request_id:
        raise _invalid(Reason.INVALID_REQUEST, "request_id is required", "request_id")
    if not request.prompt_token_ids:
        raise _invalid(Reason.EMPTY_PROMPT, "the prompt is empty", "prompt")
    if len(request.prompt_token_ids) >= info.context_window:
        raise _invalid(
            Reason.PROMPT_TOO_LONG,
            f"the prompt has {len(request.prompt_token_ids)} tokens; the context window is "
            f"{info.context_window}, including at least one output token",
            "prompt",
        )
    if len(request.context_token_ids) > info.context_window:
        raise _invalid(
            Reason.INVALID_REQUEST,
            "the prompt and the resumed output exceed the context window",
            "resume_output_token_ids",
        )
    for param, token_ids in (
        ("prompt_token_ids", request.prompt_token_ids),
        ("resume_output_token_ids", request.resume_output_token_ids),
    ):
        outside = [token_id for token_id in token_ids if token_id >= info.vocab_size]
        if outside:
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"token id {outside[0]} is outside the vocabulary of {info.vocab_size}",
                param,
            )
    _validate_disaggregation(request, info)
    sampling = request.sampling
    if sampling.max_tokens is not None and sampling.max_tokens <= 0:
        raise _invalid(
            Reason.INVALID_SAMPLING, f"max_tokens must be positive, got {sampling.max_tokens}", "max_tokens"
        )
    if sampling.temperature is not None and not (
        math.isfinite(sampling.temperature) and sampling.temperature >= 0
    ):
        raise _invalid(
            Reason.INVALID_SAMPLING,
            f"temperature must be zero or positive, got {sampling.temperature}",
            "temperature",
        )
    if sampling.top_p is not None and not 0 < sampling.top_p <= 1:
        raise _invalid(Reason.INVALID_SAMPLING, f"top_p must be in (0, 1], got {sampling.top_p}", "top_p")
    validate_sampling_features(sampling, info.vocab_size)


def validate_sampling_features(sampling: SamplingOptions, vocab_size: int) -> None:
    """Raise ``InvalidArgument`` unless penalties, logit bias, logprobs, tools,
    tool choice and response format are each in range and consistent.
    Params are named as the OpenAI API names them (``tools[0].function.name``)."""
    for param, penalty in (
        ("presence_penalty", sampling.presence_penalty),
        ("frequency_penalty", sampling.frequency_penalty),
    ):
        if penalty is not None and not (
            math.isfinite(penalty) and PENALTY_RANGE[0] <= penalty <= PENALTY_RANGE[1]
        ):
            raise _invalid(Reason.INVALID_SAMPLING, f"{param} must be in [-2, 2], got {penalty}", param)
    for token_id, bias in sampling.logit_bias:
        if token_id >= vocab_size:
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"logit_bias names token id {token_id}, outside the vocabulary of {vocab_size}",
                "logit_bias",
            )
        if not (math.isfinite(bias) and LOGIT_BIAS_RANGE[0] <= bias <= LOGIT_BIAS_RANGE[1]):
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"logit_bias of token {token_id} must be in [-100, 100], got {bias}",
                "logit_bias",
            )
    if sampling.top_logprobs is not None:
        if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {sampling.top_logprobs}",
                "top_logprobs",
            )
        if not sampling.logprobs:
            raise _invalid(Reason.INVALID_SAMPLING, "top_logprobs needs logprobs set to true", "top_logprobs")
    _validate_tools(sampling.tools)
    _validate_tool_choice(sampling.tool_choice, sampling.tools)
    if sampling.response_format is not None:
        _validate_response_format(sampling.response_format)


_CHOICE_MODES: dict[ToolChoiceMode, ChoiceMode] = {
    ToolChoiceMode.NONE: "none",
    ToolChoiceMode.AUTO: "auto",
    ToolChoiceMode.REQUIRED: "required",
    ToolChoiceMode.NAMED: "named",
}


def _validate_tools(tools: Sequence[ToolSpec]) -> None:
    problem = tool_names_problem([tool.name for tool in tools])
    if problem is not None:
        index, message = problem
        raise _invalid(Reason.INVALID_SAMPLING, message, f"tools[{index}].function.name")
    for i, tool in enumerate(tools):
        if tool.parameters_json:
            _json_object(tool.parameters_json, f"tools[{i}].function.parameters", "the tool's parameters")


def _validate_tool_choice(choice: ToolChoiceSpec, tools: Sequence[ToolSpec]) -> None:
    problem = tool_choice_problem(_CHOICE_MODES[choice.mode], choice.name, {tool.name for tool in tools})
    if problem is not None:
        raise _invalid(Reason.INVALID_SAMPLING, problem, "tool_choice")


def _validate_response_format(response_format: ResponseFormatSpec) -> None:
    if response_format.type != ResponseFormatType.JSON_SCHEMA:
        if response_format.schema_json or response_format.schema_name:
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"response_format {response_format.type.value!r} takes no json_schema",
                "response_format",
            )
        return
    if not response_format.schema_json:
        raise _invalid(
            Reason.INVALID_SAMPLING,
            "response_format json_schema needs a schema",
            "response_format.json_schema.schema",
        )
    if response_format.schema_name and not is_function_name(response_format.schema_name):
        raise _invalid(
            Reason.INVALID_SAMPLING,
            f"the json_schema name must be {FUNCTION_NAME_RULE}",
            "response_format.json_schema.name",
        )
    _json_object(response_format.schema_json, "response_format.json_schema.schema", "the schema")


def _json_object(text: str, param: str, what: str) -> None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise _invalid(Reason.INVALID_SAMPLING, f"{what} is not valid JSON: {exc}", param) from exc
    if not isinstance(value, dict):
        raise _invalid(Reason.INVALID_SAMPLING, f"{what} must be a JSON object", param)


def _validate_disaggregation(request: GenerationRequest, info: EngineInfo) -> None:
    """A prefill phase goes to a pod that prefills, a decode phase with a
    handle that covers exactly its context."""
    if request.prefill_only and request.kv_transfer is not None:
        raise _invalid(Reason.INVALID_REQUEST, "set prefill_only or kv_transfer, not both", "kv_transfer")
    if request.prefill_only and info.role == "decode":
        raise _invalid(
            Reason.INVALID_REQUEST,
            f"pod {info.pod_id} is a decode pod; it takes no prefill phase",
            "prefill_only",
        )
    if request.kv_transfer is not None:
        if info.role == "prefill":
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"pod {info.pod_id} is a prefill pod; it takes no decode phase",
                "kv_transfer",
            )
        if request.kv_transfer.prompt_tokens != len(request.context_token_ids):
            raise _invalid(
                Reason.INVALID_REQUEST,
                f"the KV transfer covers {request.kv_transfer.prompt_tokens} tokens; the context has "
                f"{len(request.context_token_ids)}",
                "kv_transfer",
            )
        _validate_handle(request.kv_transfer)


def _validate_handle(handle: KvTransferSpec) -> None:
    """A handle's counts within its prompt: a block holds at least one token,
    and the prefill pod's cache hits (what the turn is billed as cached) are
    some of its prompt tokens. No prefill pod issues a handle outside these,
    and forged hits would bill a turn as cached (or as negative cached tokens)."""
    if not 0 <= handle.blocks <= handle.prompt_tokens:
        raise _invalid(
            Reason.INVALID_REQUEST,
            f"a KV transfer of {handle.prompt_tokens} tokens moves 0 to {handle.prompt_tokens} blocks, "
            f"not {handle.blocks}",
            "kv_transfer",
        )
    if not 0 <= handle.cached_prompt_tokens <= handle.prompt_tokens:
        raise _invalid(
            Reason.INVALID_REQUEST,
            f"a KV transfer's cached prompt tokens are 0 to {handle.prompt_tokens}, "
            f"not {handle.cached_prompt_tokens}",
            "kv_transfer",
        )
