"""Checks every generation request passes before it reaches a backend.

Each failure is an ``InvalidArgument`` with an ErrorInfo reason and the
offending field as ``metadata["param"]``, so the edge can map it to
OpenAI's error object without parsing messages.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from engine.backend import EngineInfo, GenerationRequest
from llmmesh.errors import InvalidArgument, Reason


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
