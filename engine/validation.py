"""Checks every generation request passes before it reaches a backend.

Each failure is an ``InvalidArgument`` with an ErrorInfo reason and the
offending field as ``metadata["param"]``, so the edge can map it to
OpenAI's error object without parsing messages.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Sequence

from engine.backend import (
    EngineInfo,
    GenerationRequest,
    ResponseFormatSpec,
    ResponseFormatType,
    SamplingOptions,
    ToolChoiceMode,
    ToolChoiceSpec,
    ToolSpec,
)
from llmmesh.errors import InvalidArgument, Reason

PENALTY_RANGE = (-2.0, 2.0)
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_TOP_LOGPROBS = 20
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""What a tool's or a JSON schema's name may be, as in the OpenAI API."""


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


def _validate_tools(tools: Sequence[ToolSpec]) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not NAME_PATTERN.fullmatch(tool.name):
            raise _invalid(
                Reason.INVALID_SAMPLING,
                f"tool name {tool.name[:80]!r} must be 1 to 64 letters, digits, underscores or dashes",
                f"tools[{i}].function.name",
            )
        if tool.name in seen:
            raise _invalid(
                Reason.INVALID_SAMPLING, f"tool {tool.name!r} is given twice", f"tools[{i}].function.name"
            )
        seen.add(tool.name)
        if tool.parameters_json:
            _json_object(tool.parameters_json, f"tools[{i}].function.parameters", "the tool's parameters")


def _validate_tool_choice(choice: ToolChoiceSpec, tools: Sequence[ToolSpec]) -> None:
    if choice.mode != ToolChoiceMode.NAMED and choice.name:
        raise _invalid(
            Reason.INVALID_SAMPLING,
            f"tool_choice {choice.mode.value!r} names no function; a named choice does",
            "tool_choice",
        )
    if choice.mode == ToolChoiceMode.NONE:
        return
    if not tools:
        raise _invalid(
            Reason.INVALID_SAMPLING, f"tool_choice {choice.mode.value!r} needs tools", "tool_choice"
        )
    if choice.mode == ToolChoiceMode.NAMED and all(tool.name != choice.name for tool in tools):
        raise _invalid(
            Reason.INVALID_SAMPLING,
            f"tool_choice names {choice.name[:80]!r}, which is not one of the tools",
            "tool_choice",
        )


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
    if response_format.schema_name and not NAME_PATTERN.fullmatch(response_format.schema_name):
        raise _invalid(
            Reason.INVALID_SAMPLING,
            "the json_schema name must be 1 to 64 letters, digits, underscores or dashes",
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
